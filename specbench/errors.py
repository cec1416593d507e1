"""One exception type for bad user input, so run.py can print it as a single clear line."""


class SpecbenchError(ValueError):
    """A configuration, input or checkpoint problem the user can fix; the message names the value and the fix."""
