"""The FOCUS export's InvoiceId scheme (``[focus] invoice_id`` in the site config): the fields it may name and
its check. Here, below both, so the site's settings (``ledger.ingest.site``) refuse a bad scheme when the
configuration is read, and the FOCUS writer (``reports.focus``) fills the same fields."""

from __future__ import annotations

import re

DEFAULT_INVOICE_SCHEME = "{cluster}-{YYYY-MM}-{tenant}"
INVOICE_FIELDS = ("cluster", "YYYY-MM", "YYYY", "MM", "tenant")


class InvoiceSchemeError(ValueError):
    """A site's InvoiceId scheme with an unknown field (one line, naming the config field)."""


def check_invoice_scheme(scheme: str) -> str:
    """The scheme itself when every ``{field}`` in it is one of :data:`INVOICE_FIELDS`."""
    for f in re.findall(r"\{([^{}]*)\}", scheme):
        if f not in INVOICE_FIELDS:
            raise InvoiceSchemeError(f"focus.invoice_id: unknown field {{{f}}} in {scheme!r} "
                                     f"(fields: {', '.join('{' + x + '}' for x in INVOICE_FIELDS)})")
    if not scheme.strip():
        raise InvoiceSchemeError("focus.invoice_id: empty scheme")
    return scheme
