"""A frozen record class for the hooks' fast path: what ``@dataclass(frozen=True)`` gives, without its import.

``dataclasses`` pulls in ``inspect`` (and through it ``ast``, ``dis``, ``tokenize``): ≈ 10 ms under
``python -I -S``, as much as the interpreter's own start. The hooks' own records (``hooks.core``'s settings,
``hooks.slurm``'s answers) and those of the source parsers (:mod:`ledger.capture.sources`, which the hooks do
not call: ship time does, and they share the parsers of ``hooks.vendor``) are declared on :class:`Frozen`: fields
in ``__slots__`` (their order is the positional order), defaults in ``_defaults`` (a value, or a zero-argument
callable for mutable ones, like ``field(default_factory=...)``), keyword or positional construction, value
equality, hash, a dataclass-style repr, pickling and copying, and no assignment after construction. Standard
library only, no imports.
"""


class Frozen:
    __slots__ = ()
    _defaults: dict = {}

    def __init__(self, *args, **kw) -> None:
        names = self.__slots__
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__}: {len(args)} positional values for {len(names)} fields")
        for name, value in zip(names, args):
            if name in kw:
                raise TypeError(f"{type(self).__name__}: field {name!r} given twice")
            kw[name] = value
        for name in names:
            if name in kw:
                value = kw.pop(name)
            elif name in self._defaults:
                value = self._defaults[name]
                if callable(value):
                    value = value()
            else:
                raise TypeError(f"{type(self).__name__}: missing field {name!r}")
            object.__setattr__(self, name, value)
        if kw:
            raise TypeError(f"{type(self).__name__}: unexpected fields {sorted(kw)}")

    def __setattr__(self, name, value):
        raise AttributeError(f"cannot assign to field {name!r} of a frozen {type(self).__name__}")

    def __delattr__(self, name):
        raise AttributeError(f"cannot delete field {name!r} of a frozen {type(self).__name__}")

    def __reduce__(self):
        # pickle and copy would restore the slots one by one through __setattr__, which refuses: rebuild instead
        return (type(self), self._values())

    def _values(self) -> tuple:
        return tuple(getattr(self, n) for n in self.__slots__)

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())  # like a frozen dataclass: fails only if a field is unhashable

    def __repr__(self) -> str:
        return f"{type(self).__name__}(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in self.__slots__) + ")"
