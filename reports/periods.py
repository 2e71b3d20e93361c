"""Billing periods for the reports: :mod:`ledger.periods` under its old name.

The periods moved into the ledger's foundation because the store derives each issued receipt's lines per
period part as it appends them (:mod:`ledger.receipt_lines`); reports keep importing them from here.
"""

from ledger.periods import (  # noqa: F401 - re-exported
    DEFAULT_PERIOD_RULE, NANO, PERIOD_RULES, PeriodError, billing_month, days_spanned, month_bounds, month_of,
    months_spanned, part_spans, placement, split_int, split_nano, weights_of)
