"""The one error the conversion tools raise for bad input: its message is the line the user sees."""


class ConvertError(ValueError):
    """Input that cannot be converted faithfully; one line, addressed to the user."""
