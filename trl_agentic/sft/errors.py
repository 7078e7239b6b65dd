"""The error of a demonstration that cannot become training data."""


class DemonstrationError(ValueError):
    """A demonstration that the rollout engine could not have produced; the message says which turn and why."""
