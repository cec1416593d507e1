"""What an execution's multi-row verify computes of each row against that row's one-row forward, in one set of names:
an openvino route claims one from its construction, the machine profile's row check measures one, and both are read
as the same promise: BITWISE; ROUNDING, equal up to float rounding (float activations, whose sums a kernel may block
otherwise for another row count); DIFFERS, beyond it (activations quantised per call). A lossless target needs one of
the first two."""

BITWISE, ROUNDING, DIFFERS = "bitwise", "float rounding", "differs"
