"""Online threshold auto-tuner: a doubling search per level, decided by interleaved A/B trials.

Trainer-independent and deterministic: it sees only (step, step time, loss) and says which
(intra_mb, inter_mb) the next step must run with. The trainer asks it on rank 0, broadcasts the
answer and applies it at the step boundary.

The search (issue 5, item 4; the seed's "accept a larger threshold only if throughput improves
by > 3% and the loss differs by < 0.5%"):

- Levels in order: intra, then inter. Each starts from the incumbent (at first the cost model's
  recommendation) and looks upward first: candidate = 2 x incumbent, within the level's range
  ([min_mb, max_mb]; the inter level's own [inter_min_mb, inter_max_mb] where given).
- A comparison runs `trials_per_candidate` interleaved trials A, B, A, B (A = incumbent, B =
  candidate). A trial discards `warmup_steps` steps when the thresholds just changed, then
  measures `steps_per_trial` steps. Step times are compared by their medians, which a single
  slow step (a first step, a restart, a checkpoint write) does not move.
- B replaces A only when its median step time is lower by more than `throughput_margin`
  (relative) AND the mean losses over the matched steps (every A step has a B step at the same
  position of the next trial) differ by less than `loss_margin` (relative; a non-finite loss
  never passes). A move needs evidence: going up, a tie keeps the smaller threshold; going
  down it keeps the incumbent, so a flat response plus noise never moves the tuner.
- Doublings that would run the incumbent's very collectives (a `same_plan` the trainer passes:
  LGS closes buckets at layer boundaries, so every threshold below a layer's bytes is one plan,
  and an inter cap above a bucket's shard changes nothing) are skipped, not trialled: comparing
  a plan with itself only measures noise, and would end the direction before a doubling that
  does change the plan.
- An accepted candidate becomes the incumbent and the search continues the same way; a rejected
  one ends that direction (gains saturated). Step time against threshold is taken to be
  U-shaped (latency on the left, an exposed tail on the right): once the upward search has moved,
  the threshold below the start cannot win, so the level ends; if it did not move, the search
  turns downward.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass

LEVELS = ("intra", "inter")
_STATE_VERSION = 1


@dataclass(frozen=True)
class TunerConfig:
    min_mb: float = 8
    max_mb: float = 256
    throughput_margin: float = 0.03  # accept only if the median step time improves by > 3%
    loss_margin: float = 0.005  # and the mean loss over matched steps differs by < 0.5%
    steps_per_trial: int = 2  # steps measured per trial (A or B)
    trials_per_candidate: int = 4  # interleaved A/B/A/B trials per comparison (2 A + 2 B)
    warmup_steps: int = 1  # steps discarded after each switch
    # The inter-node message cap's own range (None: min_mb / max_mb): it is usually well below
    # the intra threshold (a bucket's inter-node messages are its per-rank shard, or smaller).
    inter_min_mb: float | None = None
    inter_max_mb: float | None = None

    def __post_init__(self) -> None:
        for level in range(len(LEVELS)):
            lo, hi = self.bounds(level)
            if not 0 < lo <= hi:
                raise ValueError(f"need 0 < min <= max MB for the {LEVELS[level]} level, got "
                                 f"{lo}, {hi}")
        if not 0 <= self.throughput_margin < 1 or not 0 <= self.loss_margin:
            raise ValueError("need 0 <= throughput_margin < 1 and loss_margin >= 0")
        if self.steps_per_trial < 1 or self.warmup_steps < 0:
            raise ValueError("need steps_per_trial >= 1 and warmup_steps >= 0")
        if self.trials_per_candidate < 2 or self.trials_per_candidate % 2:
            raise ValueError(f"trials_per_candidate must be even and >= 2 (as many A as B), "
                             f"got {self.trials_per_candidate}")

    def bounds(self, level: int) -> tuple[float, float]:
        """[min, max] MB of level `level` (0: intra, 1: inter)."""
        if level == 1:
            return (self.min_mb if self.inter_min_mb is None else self.inter_min_mb,
                    self.max_mb if self.inter_max_mb is None else self.inter_max_mb)
        return self.min_mb, self.max_mb


class ThresholdTuner:
    """Doubling search over (intra_mb, inter_mb); see the module docstring."""

    def __init__(self, start: tuple[float, float], config: TunerConfig = TunerConfig(),
                 same_plan: Callable[[tuple[float, float], tuple[float, float]], bool]
                 | None = None) -> None:
        self.config = config
        self._same_plan = same_plan
        for level, (name, mb) in enumerate(zip(LEVELS, start, strict=True)):
            lo, hi = config.bounds(level)
            if not lo <= mb <= hi:
                raise ValueError(f"start {name} threshold {mb} MB outside [{lo}, {hi}] MB")
        self._start = [float(mb) for mb in start]
        self._best = list(self._start)
        self._level = 0
        self._direction = "up"
        self._moved = False  # the upward search of this level accepted a candidate
        self._candidate: float | None = None
        self._trial = 0  # index of the running trial within the comparison
        self._steps_in_trial = 0
        self._warmup_left = 0
        self._times: dict[str, list[float]] = {"A": [], "B": []}
        self._losses: dict[str, list[float]] = {"A": [], "B": []}
        self._first_step: int | None = None  # first step of the running comparison
        self._last_step: int | None = None
        self._last_run: list[float] | None = None  # thresholds the last recorded step ran with
        self.trials = 0  # measurement blocks completed (each A or B trial counts one)
        self.decisions: list[dict] = []
        self._begin_comparison()

    @property
    def done(self) -> bool:
        return self._level >= len(LEVELS)

    @property
    def best(self) -> tuple[float, float]:
        """The incumbent: what the tuner would settle on if stopped now."""
        return self._best[0], self._best[1]

    def thresholds(self) -> tuple[float, float]:
        """(intra_mb, inter_mb) the next step must run with."""
        if self.done:
            return self.best
        return self._arm("A" if self._trial % 2 == 0 else "B")

    def record(self, step: int, step_time: float, loss: float) -> None:
        """Result of step `step`, run with thresholds(); a no-op once the search is done."""
        if self._last_step is not None and step <= self._last_step:
            raise ValueError(f"steps must increase: got {step} after {self._last_step}")
        if not (math.isfinite(step_time) and step_time > 0):
            raise ValueError(f"step time must be finite and > 0 s, got {step_time}")
        ran = list(self.thresholds())
        self._last_step = step
        if self.done:
            return
        self._last_run = ran
        if self._first_step is None:
            self._first_step = step
        if self._warmup_left:
            self._warmup_left -= 1
            return
        arm = "A" if self._trial % 2 == 0 else "B"
        self._times[arm].append(float(step_time))
        self._losses[arm].append(float(loss))
        self._steps_in_trial += 1
        if self._steps_in_trial < self.config.steps_per_trial:
            return
        self.trials += 1
        self._trial += 1
        if self._trial < self.config.trials_per_candidate:
            self._begin_trial()
        else:
            self._decide(step)
            self._begin_comparison()

    def state_dict(self) -> dict:
        """Everything needed to continue the search; plain Python types (JSON-safe)."""
        return {
            "version": _STATE_VERSION,
            "config": asdict(self.config),
            "start": list(self._start),
            "best": list(self._best),
            "level": self._level,
            "direction": self._direction,
            "moved": self._moved,
            "candidate": self._candidate,
            "trial": self._trial,
            "steps_in_trial": self._steps_in_trial,
            "warmup_left": self._warmup_left,
            "times": {k: list(v) for k, v in self._times.items()},
            "losses": {k: list(v) for k, v in self._losses.items()},
            "first_step": self._first_step,
            "last_step": self._last_step,
            "last_run": None if self._last_run is None else list(self._last_run),
            "trials": self.trials,
            "decisions": [dict(d) for d in self.decisions],
        }

    def load_state_dict(self, state: dict) -> None:
        """Continue a saved search exactly where it stopped (mid-trial included)."""
        if state.get("version") != _STATE_VERSION:
            raise ValueError(f"tuner state version {state.get('version')!r} is not "
                             f"{_STATE_VERSION}")
        saved = TunerConfig(**state["config"])
        if saved != self.config:
            raise ValueError(f"tuner state was saved with {saved}, this run has {self.config}; "
                             "a search cannot continue under different rules")
        self._start = [float(x) for x in state["start"]]
        self._best = [float(x) for x in state["best"]]
        self._level = int(state["level"])
        self._direction = str(state["direction"])
        self._moved = bool(state["moved"])
        self._candidate = None if state["candidate"] is None else float(state["candidate"])
        self._trial = int(state["trial"])
        self._steps_in_trial = int(state["steps_in_trial"])
        self._warmup_left = int(state["warmup_left"])
        self._times = {k: [float(x) for x in state["times"][k]] for k in ("A", "B")}
        self._losses = {k: [float(x) for x in state["losses"][k]] for k in ("A", "B")}
        self._first_step = state["first_step"]
        self._last_step = state["last_step"]
        self._last_run = None if state["last_run"] is None else [float(x)
                                                                 for x in state["last_run"]]
        self.trials = int(state["trials"])
        self.decisions = [dict(d) for d in state["decisions"]]

    def _arm(self, arm: str) -> tuple[float, float]:
        th = list(self._best)
        if arm == "B":
            assert self._candidate is not None
            th[self._level] = self._candidate
        return th[0], th[1]

    def _begin_trial(self) -> None:
        self._steps_in_trial = 0
        switched = self._last_run != list(self.thresholds())
        self._warmup_left = self.config.warmup_steps if switched else 0

    def _begin_comparison(self) -> None:
        self._candidate = self._next_candidate()
        self._trial = 0
        self._times = {"A": [], "B": []}
        self._losses = {"A": [], "B": []}
        self._first_step = None
        if not self.done:
            self._begin_trial()

    def _next_candidate(self) -> float | None:
        """The next threshold to try at the current level, moving on when a level is spent."""
        while not self.done:
            lo, hi = self.config.bounds(self._level)
            factor = 2.0 if self._direction == "up" else 0.5
            candidate = self._best[self._level] * factor
            while lo <= candidate <= hi and self._same(candidate):
                candidate *= factor
            if lo <= candidate <= hi:
                return candidate
            self._end_direction()
        return None

    def _same(self, candidate: float) -> bool:
        """The candidate threshold of the current level runs the incumbent's plan."""
        if self._same_plan is None:
            return False
        other = list(self._best)
        other[self._level] = candidate
        return self._same_plan((other[0], other[1]), self.best)

    def _end_direction(self) -> None:
        if self._direction == "up" and not self._moved:
            self._direction = "down"
            return
        self._level += 1
        self._direction = "up"
        self._moved = False

    def _decide(self, last_step: int) -> None:
        c = self.config
        assert self._candidate is not None
        med_a, med_b = (statistics.median(self._times[k]) for k in ("A", "B"))
        loss_a, loss_b = (statistics.fmean(self._losses[k]) for k in ("A", "B"))
        speedup = (med_a - med_b) / med_a
        gap = abs(loss_b - loss_a)
        loss_diff = gap / abs(loss_a) if loss_a else (0.0 if gap == 0 else math.inf)
        faster = speedup > c.throughput_margin
        # NaN compares false: a non-finite loss on either side never passes the guard.
        loss_ok = loss_diff < c.loss_margin
        incumbent = self._best[self._level]
        if faster and loss_ok:
            reason = f"faster by {speedup:.1%} > {c.throughput_margin:.1%}, loss within margin"
        elif faster:
            reason = (f"faster by {speedup:.1%} but loss differs by {loss_diff:.2%} "
                      f"(>= {c.loss_margin:.2%})")
        elif speedup >= -c.throughput_margin:
            reason = (f"tie ({speedup:+.1%} within {c.throughput_margin:.1%}): "
                      f"kept {incumbent:g} MB")
        else:
            reason = f"slower by {-speedup:.1%}"
        accepted = faster and loss_ok
        self.decisions.append({
            "level": LEVELS[self._level],
            "direction": self._direction,
            "incumbent_mb": incumbent,
            "candidate_mb": self._candidate,
            "median_incumbent_s": med_a,
            "median_candidate_s": med_b,
            "speedup": speedup,
            "loss_incumbent": loss_a,
            "loss_candidate": loss_b,
            "loss_diff": loss_diff,
            "accepted": accepted,
            "reason": reason,
            "first_step": self._first_step,
            "last_step": last_step,
        })
        if accepted:
            self._best[self._level] = self._candidate
            self._moved = self._moved or self._direction == "up"
        else:
            self._end_direction()
        self.decisions[-1]["thresholds_after"] = list(self._best)


def describe(decision: dict) -> str:
    """One log line for a decision."""
    d = decision
    verdict = "accepted" if d["accepted"] else "rejected"
    return (f"lgs-autotune {d['level']} {d['direction']}: {d['incumbent_mb']:g} -> "
            f"{d['candidate_mb']:g} MB {verdict} (median step {d['median_incumbent_s']:.4f} s vs "
            f"{d['median_candidate_s']:.4f} s, loss diff {d['loss_diff']:.3%}; {d['reason']}; "
            f"steps {d['first_step']}-{d['last_step']})")
