"""Typed exceptions shared by algorithms/, gpusim/ and kernels/.

Every message is one line that says what is wrong and what is allowed, so the
CLI can print it as is (exit status 2) and API users can catch one base class.
"""


class GpusimError(ValueError):
    """Base of every input error gpusim raises on purpose."""


class InvalidProblem(GpusimError):
    """An AttentionProblem field is out of range or inconsistent."""


class InvalidConfig(GpusimError):
    """A TileConfig field is out of range, or does not suit the algorithm."""


class DoesNotFit(InvalidConfig):
    """A config needs more of an on-chip resource than the GPU has."""

    def __init__(self, resource: str, required: int, limit: int, detail: str = ""):
        self.resource = resource
        self.required = required
        self.limit = limit
        extra = f" ({detail})" if detail else ""
        super().__init__(
            f"out of resource: {resource}, Required: {required}, Hardware limit: {limit}{extra}"
        )


class UnsupportedAlgorithm(GpusimError):
    """The algorithm is unknown, or the GPU lacks a feature it needs."""


class ProfileError(GpusimError):
    """A hardware-profile file is missing, malformed or names an unknown GPU."""


class ResultsFileError(GpusimError):
    """A results CSV is missing columns or holds values that cannot be read."""
