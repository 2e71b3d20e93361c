"""`ipledger collect`: the node collector (placeholder replaced below)."""


def register(cli):  # noqa: ANN001, ANN201
    return None
