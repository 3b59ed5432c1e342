"""The necks between a body and the heads: the FPN (``fpn``)."""
