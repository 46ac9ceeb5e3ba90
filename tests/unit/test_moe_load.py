"""Expert-load counting on a routing map checked by hand."""

from __future__ import annotations

import math

import torch

from megatron_lgs.moe_load import LayerLoad, log_lines, metrics_record, routing_counts

# 5 tokens, 4 experts, top-2; token 3 lost one assignment and token 4 both to the capacity.
ROUTING = torch.tensor([
    [1, 1, 0, 0],
    [1, 0, 1, 0],
    [1, 1, 0, 0],
    [0, 1, 0, 0],
    [0, 0, 0, 0],
], dtype=torch.bool)


def test_tokens_per_expert_and_dropped_assignments_of_a_hand_made_routing_map():
    per_expert, dropped = routing_counts(ROUTING, topk=2)
    assert per_expert.tolist() == [3, 3, 1, 0]
    assert dropped == 5 * 2 - 7 == 3


def test_dropless_routing_drops_nothing():
    full = torch.tensor([[1, 0, 1], [0, 1, 1]], dtype=torch.bool)
    per_expert, dropped = routing_counts(full, topk=2)
    assert per_expert.tolist() == [1, 1, 2] and dropped == 0


def test_log_line_and_record_of_the_hand_made_routing():
    per_expert, dropped = routing_counts(ROUTING, topk=2)
    load = LayerLoad(layer=3, tokens_per_expert=per_expert.tolist(), dropped=dropped,
                     aux_losses={"load_balancing_loss": 1.25})
    # mean 7/4 = 1.75 tokens per expert, busiest 3: 3 / 1.75
    assert load.imbalance == 3 / 1.75
    (line,) = log_lines([load])
    assert line == (" moe layer 3 | tokens per expert: 3 3 1 0 | imbalance (max/mean): 1.714 |"
                    " dropped tokens: 3 | load_balancing_loss: 1.2500 |")
    assert metrics_record([load]) == {
        "imbalance.layer_3": 3 / 1.75, "dropped.layer_3": 3,
        "tokens_per_expert.layer_3": [3, 3, 1, 0], "load_balancing_loss.layer_3": 1.25}


def test_a_layer_that_routed_nothing_has_no_imbalance():
    assert math.isnan(LayerLoad(1, [0, 0], 0, {}).imbalance)
