"""Values a ``tailjit.jit`` function reads from outside its arguments.

Researchers' functions read tensors from their closure (``def make(w): return lambda x: x @ w``), from
their module's globals (``ANCHORS = torch.tensor(...)``) and, as bound methods, from their module
(``self.weight``).  ``make_fx`` traces the arguments' tensors only, so each such tensor becomes an extra
input: read again at every call (a rebinding or an optimizer's step is seen, and a captured tensor that
requires grad gets its gradient) and handed, while tracing, to a copy of the function whose closure cells
and globals hold the traced tensors instead.  A module's parameters and buffers are handed over through
``torch.func.functional_call``, as ``tailjit.jit(module)`` does.  Floats (also a module's float settings,
``self.temperature``) are passed the same way, so they follow ``tailjit.jit``'s policy for float arguments
(baked into the first trace, read by one trace once one changes); other numbers and strings key the traces as
static arguments do, so a new value traces again instead of reusing one baked into a trace.

A *source* is where one such value lives: a closure cell, a global name, or the module a method is bound
to.  The sources are found when ``tailjit.jit`` is applied, among the names the function's code loads that
then hold a tensor, a module, a container of tensors or a number, or nothing yet: a name bound later (a
constant or a helper defined below the decorated function, a global set to ``None`` until some setup runs)
is a source holding ``None``, so binding it changes the key, and the sources are then found again (a
helper's own globals join them).  A module's sources are the module and the numbers and unbound names the
``forward`` of each class in its tree reads from its globals.  The attributes the code reads from the user's
modules, classes and objects (``Config.scale``, ``self.cfg.k``, a class attribute through ``self``), found as
attribute chains in its bytecode, and mutable default arguments are sources too, read for their numbers
(``frozen``); a numpy array among them makes the trace refuse (``CapturedArray``).  An object of the user's
classes or a namespace that the code uses whole (passes to a function, calls a method of) is a source read
for all it holds (``frozen`` walks it), as ``tailjit.jit`` keys such an object passed as an argument: code
the bytecode here does not show reads it.
"""

from __future__ import annotations

import argparse
import builtins
import dis
import enum
import functools
import inspect
import itertools
import math
import operator
import os
import sys
import sysconfig
import types
from dataclasses import dataclass

import numpy as np
import torch
import torch.utils._pytree as pytree

import tailjit

#: Values keyed by value: a new one traces again.
_SCALARS = (bool, int, float, complex, str)
_CONTAINERS = (list, tuple, dict)


@dataclass(frozen=True, eq=False)
class Source:
    """Where one captured value lives: ``kind`` is ``"cell"``, ``"global"`` or ``"self"``; or ``"attr"``, an
    attribute the code reads from one of those (``cfg.scale``, ``Config.scale``, ``consts.SCALE``,
    ``self.cfg.k``: ``holder`` is that source, ``path`` the attributes, none for an object used whole), or
    ``"default"``, a function's
    ``__defaults__`` or ``__kwdefaults__`` (``name``) holding a list, dict, array or object.  The last two
    are read for their numbers alone, which key the traces (``frozen``)."""

    kind: str
    name: str
    holder: object  # the cell, the globals dict, the bound method's module, the attribute's source, the function
    path: tuple = ()

    def raw(self):
        """What a cell, global or attribute holds, :data:`UNBOUND` where nothing."""
        if self.kind == "cell":
            try:
                return self.holder.cell_contents
            except ValueError:
                return UNBOUND
        if self.kind == "attr":
            value = self.holder.raw()
            for name in self.path:
                value = getattr(value, name, UNBOUND)
            return value
        if self.kind == "default":
            return getattr(self.holder, self.name)
        return self.holder.get(self.name, UNBOUND) if self.kind == "global" else self.holder

    def ident(self) -> tuple:
        """What makes two sources the same place (``same_sources``)."""
        holder = self.holder.ident() if self.kind == "attr" else id(self.holder)
        return (self.kind, self.name, holder)

    def expr(self, holder: str) -> str:
        """Generated code that reads it, the variable ``holder`` holding its holder (an attribute's: its root's)."""
        if self.kind == "attr":
            read = self.holder.expr(holder)
            for name in self.path:  # (a Sequential's submodules are named "0", "1", ...)
                read = f"{read}.{name}" if name.isidentifier() else f"getattr({read}, {name!r})"
            return read
        if self.kind == "default":
            return f"{holder}.{self.name}"
        return {"cell": f"{holder}.cell_contents", "global": f"{holder}.get({self.name!r})", "self": holder}[self.kind]

    def root(self):
        """The holder that :meth:`expr` names."""
        return self.holder.root() if self.kind == "attr" else self.holder

    def changed(self, now, before) -> bool:
        """Whether it holds another value ``now`` than ``before``: another object, or for a value read for its
        numbers, other numbers (a property computes a new object at each read)."""
        return frozen(now) != frozen(before) if self.kind in ("attr", "default") else now is not before

    def write(self, value) -> None:
        """Put back what :meth:`raw` read (a cell, global or attribute a trace assigned to)."""
        if self.kind == "attr" and not self.path:
            return  # an object used whole, changed in place: there is no other object to put back
        if self.kind == "attr":
            parent = self.holder.raw()
            for name in self.path[:-1]:
                parent = getattr(parent, name)
            if isinstance(inspect.getattr_static(parent, self.path[-1], None), property):
                return  # computed from attributes, which are put back themselves
            if value is UNBOUND:
                delattr(parent, self.path[-1])
            else:
                setattr(parent, self.path[-1], value)
        elif self.kind == "default":
            setattr(self.holder, self.name, value)
        elif self.kind == "cell":
            if value is UNBOUND:
                del self.holder.cell_contents
            else:
                self.holder.cell_contents = value
        elif value is UNBOUND:
            self.holder.pop(self.name, None)
        else:
            self.holder[self.name] = value

    def key(self, value) -> tuple:
        """``value``'s :func:`frozen` part as this source keys it: the method's own object used whole leaves its
        float settings to the ``"settings"`` part, which passes them (:func:`gather`)."""
        if self.kind == "attr" and not self.path and self.holder.kind == "self":
            return _object_part(value, frozenset({id(value)}), floats=False)
        return frozen(value)

    def read(self):
        """What it holds, None where nothing (a name or cell not bound yet)."""
        value = self.raw()
        return None if value is UNBOUND else value


def sources(fn) -> list[Source]:
    """The places ``fn`` reads captured values from (none for a function that reads only its arguments,
    builtins, modules, classes and functions bound when this runs)."""
    if isinstance(fn, torch.nn.Module):
        root = Source("self", type(fn).__qualname__, fn)
        found = {root.ident(): root}
        forwards = {type(m).forward for m in fn.modules()}
        for forward in sorted(forwards, key=lambda f: getattr(f, "__qualname__", "")):
            if isinstance(forward, types.FunctionType):  # its tensors come from parameters and buffers only
                for s in _global_sources(forward):
                    if not _holds_tensors(s.read()):
                        found.setdefault(s.ident(), s)
        for m in fn.modules():  # the class attributes each forward reads through ``self`` (``self.scale``)
            if isinstance(type(m).forward, types.FunctionType) and _users(m):
                mine = Source("attr", type(m).__qualname__, root, _path_to(fn, m)) if m is not fn else root
                found.update((s.ident(), s) for s in _attr_sources(type(m).forward, mine))
        return list(found.values())
    found, me = [], None
    if inspect.ismethod(fn):
        me = Source("self", "self", fn.__self__)
        if isinstance(fn.__self__, torch.nn.Module) or type(getattr(fn.__self__, "__dict__", None)) is dict:
            found.append(me)
        fn = fn.__func__
    code = getattr(fn, "__code__", None)
    if not isinstance(code, types.CodeType):
        return found
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        source = Source("cell", name, cell)
        if _watched(source.read()):
            found.append(source)
    return found + _global_sources(fn) + _attr_sources(fn, me) + _default_sources(fn)


def _path_to(module: torch.nn.Module, sub: torch.nn.Module) -> tuple:
    """The attributes from ``module`` to its submodule ``sub``."""
    name = next(n for n, m in module.named_modules() if m is sub)
    return tuple(name.split("."))


def _attr_sources(fn: types.FunctionType, me: Source | None = None) -> list[Source]:
    """The attributes that ``fn`` (and the functions it calls by name) read from the user's modules, classes
    and objects (not the installed libraries'), held by a global, a cell or, ``me``, the object ``fn`` is a
    method of, where they hold numbers, strings, flags, containers of them, arrays or None: ``Config.scale``
    patched later, ``consts.SCALE`` set with ``setattr``, ``self.cfg.k``, a class attribute ``self.gain``.
    A trace bakes them in, so they key it (``frozen``).  Not ``me``'s own settings, which :func:`gather` passes
    or keys already, nor tensors (a trace given one it does not pass stops: the call falls back)."""
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    first = fn.__code__.co_varnames[0] if me is not None and fn.__code__.co_argcount else None
    found = {}
    for f in _called(fn.__code__, fn.__globals__, {id(fn): fn}).values():
        chains, whole = _chains(f.__code__, first if f is fn else None)
        for kind, name, path in sorted(chains | whole):
            if kind == "cell" and (f is not fn or name not in cells):
                continue
            root = me if kind == "self" else Source(kind, name, cells[name] if kind == "cell" else f.__globals__)
            if not _users(root.read()):
                continue
            parent = root.read()
            # an object used whole (passed to a function, its method called: code the bytecode here does not
            # show reads it) is read for all it holds, ``me`` too (``helper(self)``, ``self.other()``); not a
            # module, whose own parts key it
            if not path and (kind, name, ()) in whole and _whole(parent, keyed=True):
                mine = Source("attr", name, root)
                found.setdefault(mine.ident(), mine)
            for k in range(1, len(path) + 1):
                source = Source("attr", ".".join((name, *path[:k])), root, path[:k])
                value = source.read()
                if isinstance(value, types.MethodType) and value.__self__ is parent:  # a method: its object, whole
                    mine = Source("attr", ".".join((name, *path[: k - 1])), root, path[: k - 1])
                    if _whole(parent, keyed=k == 1):
                        found.setdefault(mine.ident(), mine)
                    break
                static = inspect.getattr_static(parent, path[k - 1], None)
                # an attribute, or a property (read at each call too); not another descriptor's value nor a
                # module's __getattr__'s
                # (a module reached through a plain attribute, ``cfg.model.eps``, is no source: its settings are not
                # keyed by a module part, so they are attributes like any other)
                own = k == 1 and _own_setting(parent, path[k - 1], me)
                if own or (static is not value and not isinstance(static, property)):
                    break
                if _is_setting(value) or isinstance(value, (*_CONTAINERS, np.ndarray)):
                    if not _holds_tensors(value):
                        found.setdefault(source.ident(), source)
                    break
                if not _users(value):
                    break
                if (kind, name, path[:k]) in whole and _whole(value, keyed=False):
                    found.setdefault(source.ident(), source)
                parent = value
    return list(found.values())


def _whole(value, keyed: bool) -> bool:
    """Whether ``value``, used whole by a function, is read for all it holds (:func:`frozen`): a plain object,
    not a module that is a source itself (``keyed``: its own part keys it)."""
    return plain_object(value) and not (keyed and isinstance(value, torch.nn.Module))


def _own_setting(parent, name: str, me: Source | None) -> bool:
    """Whether ``parent.name`` is keyed as a setting already: the method's object's (``gather``'s
    ``"settings"``) or a module's (its settings, parameters, buffers and submodules)."""
    own = getattr(parent, "__dict__", None)
    if not isinstance(own, dict):
        return False
    module = isinstance(parent, torch.nn.Module)
    if module and any(name in getattr(parent, d) for d in ("_parameters", "_buffers", "_modules")):
        return True
    return (module or (me is not None and parent is me.read())) and name in own and _is_setting(own[name])


def _chains(code: types.CodeType, me: str | None) -> tuple[set, set]:
    """``(kind, name, attributes)`` of each attribute chain ``code`` and the code inside it load: a global
    (``"global"``), a closure variable (``"cell"``) or the argument ``me`` (``"self"``), then attributes; and
    of those whose value is then used otherwise than for an attribute (passed, called, its method called)."""
    found, whole, chain = set(), set(), None
    for ins in dis.get_instructions(code):
        if ins.opname == "LOAD_ATTR" and chain is not None:
            chain = (chain[0], chain[1], (*chain[2], ins.argval))
            found.add(chain)
            continue
        if chain is not None:
            whole.add(chain)
        chain = None
        if ins.opname == "LOAD_GLOBAL":
            chain = ("global", ins.argval, ())
        elif ins.opname in ("LOAD_DEREF", "LOAD_CLASSDEREF"):
            chain = ("cell", ins.argval, ())
        elif ins.opname == "LOAD_FAST" and ins.argval == me:
            chain = ("self", me, ())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            inner = _chains(const, None)
            found |= inner[0]
            whole |= inner[1]
    return found, whole


def _users(value) -> bool:
    """Whether ``value`` is a module, class or object of the user's code (not a function, nor the installed
    libraries' or Python's own, such as ``torch`` or ``math``): the attributes of those a function reads are
    watched."""
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, types.MethodType)) or value is None:
        return False
    if type(value) in _NAMESPACES:  # (``types``' and ``argparse``'s, but holding the user's settings)
        return True
    module = value
    if not isinstance(value, types.ModuleType):  # (the class's: an object's own attributes may be anything)
        module = sys.modules.get((value if isinstance(value, type) else type(value)).__module__)
    if module is None or module.__name__ in sys.builtin_module_names:
        return False
    file = getattr(module, "__file__", None)
    return file is None or not file.startswith(_LIBRARIES)


def _default_sources(fn: types.FunctionType) -> list[Source]:
    """``fn``'s default argument values where they hold a list, dict or array, which may change in place
    (``def f(x, scales=[1.0])``); a trace of a call that leaves them out bakes them in, so they key it."""
    found = []
    for name in ("__defaults__", "__kwdefaults__"):
        values = getattr(fn, name) or ()
        if any(isinstance(v, (list, dict, np.ndarray)) for v in (values.values() if type(values) is dict else values)):
            found.append(Source("default", name, fn))
    return found


def _global_sources(fn: types.FunctionType) -> list[Source]:
    """The global names that ``fn`` and the functions it calls by name load, where they hold a value to watch
    or nothing (and are not builtins).  Another module's tensors are left out: only the copy of ``fn`` and
    of its own module's functions can be handed a traced tensor (the trace then reports the read)."""
    env, found = fn.__globals__, []
    for f in _called(fn.__code__, env, {id(fn): fn}).values():
        own = f.__globals__
        for name in sorted(_global_names(f.__code__)):
            value = own.get(name)
            if _watched(value) and (name in own or name not in _BUILTINS) and (own is env or not _holds_tensors(value)):
                found.append(Source("global", name, own))
    return list({(s.name, id(s.holder)): s for s in found}.values())


def _called(code: types.CodeType, env: dict, found: dict) -> dict:
    """The functions ``code`` (reading the globals ``env``) calls by global name, and those they call,
    transitively, into ``found`` (id -> function); other modules' functions where they are the user's own
    code, not the installed libraries' (``torch.nn.functional``'s)."""
    for name in _global_names(code):
        value = env.get(name)
        if isinstance(value, types.FunctionType) and id(value) not in found:
            if value.__globals__ is env or not value.__code__.co_filename.startswith(_LIBRARIES):
                found[id(value)] = value
                _called(value.__code__, value.__globals__, found)
    return found


#: Where the installed libraries' code lives: functions there are not followed for their globals.
#: (and tailjit's own, wherever it is installed from: a ``tailjit.op`` is no user's object)
_LIBRARIES = (*{sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")},
              os.path.dirname(os.path.abspath(tailjit.__file__)) + os.sep)  # fmt: skip
_BUILTINS = vars(builtins)


def same_sources(a: list[Source], b: list[Source]) -> bool:
    return [s.ident() for s in a] == [s.ident() for s in b]


def _global_names(code: types.CodeType) -> set:
    """The global names ``code`` and the functions, lambdas and comprehensions inside it load."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"}
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names


def _helpers(code: types.CodeType, env: dict, found: dict | None = None) -> dict:
    """The functions of the module whose globals are ``env`` that ``code`` calls, and those they call (by
    global name): their globals are ``fn``'s, so a copy of each joins the copy of ``fn``."""
    found = {} if found is None else found
    for name in _global_names(code):
        value = env.get(name)
        if isinstance(value, types.FunctionType) and value.__globals__ is env and name not in found:
            found[name] = value
            _helpers(value.__code__, env, found)
    return found


def _watched(value) -> bool:
    """Whether a source holding ``value`` is read at every call: a tensor, a module, a container (of tensors,
    numbers, ...), a number or string, an array, a function (keyed by identity: a helper rebound later, or
    ``act = torch.tanh`` swapped for another), or nothing (``None``, an unbound name or cell: it may be bound
    later)."""
    return value is None or isinstance(value, _WATCHED)


_WATCHED = (torch.Tensor, torch.nn.Module, *_SCALARS, *_CONTAINERS, np.ndarray, types.FunctionType,
            types.BuiltinFunctionType, functools.partial)  # fmt: skip


def _holds_tensors(value) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (list, tuple, dict)):
        return any(isinstance(x, torch.Tensor) for x in pytree.tree_leaves(value))
    return False


def gather(found: list[Source], floats: bool = True) -> tuple[tuple, list]:
    """This call's key (one part per source: what its value is, apart from its tensors and floats) and the
    values to pass as inputs, in order: the tensors (a module's parameters and buffers), and with ``floats``
    the floats of cells and globals, and in any case modules' float settings.  A float passed is an argument
    of the traced function like any other: baked into its first trace, read by one trace once it changes
    (``JitFunction.dynamic_floats``); ``floats`` is False for a module's own trace, whose forward reads its
    globals where no copy can hand it another value."""
    key, passed = [], []
    for source in found:
        value = source.read()
        if isinstance(value, torch.Tensor):
            passed.append(value)
            key.append(_TENSOR)
        elif type(value) is float and floats:
            passed.append(value)
            key.append(_FLOAT)
        elif isinstance(value, torch.nn.Module):
            names = []
            for name, t in itertools.chain(value.named_parameters(), value.named_buffers()):
                names.append(name)
                passed.append(t)
            settings = tuple(_settings_key(m, passed) for m in value.modules())
            key.append(("module", value, tuple(m.training for m in value.modules()), tuple(names), settings))
        elif source.kind == "self":  # a plain object whose method it is: its settings (``self.gamma``)
            key.append(("settings", value, _settings_key(value, passed)))
        elif source.kind in ("attr", "default") or (type(value) in _CONTAINERS and not _holds_tensors(value)):
            key.append(("frozen", source.key(value)))  # read for its numbers alone (``L[0]``, ``cfg.scale``)
        elif isinstance(value, _CONTAINERS):
            leaves, spec = pytree.tree_flatten(value)
            passed += [x for x in leaves if isinstance(x, torch.Tensor)]
            key.append(("tree", spec, tuple(None if isinstance(x, torch.Tensor) else _static(x) for x in leaves)))
        else:
            key.append(_static(value))
    return tuple(key), passed


MISS = object()
UNBOUND = object()  # what an unbound cell or global holds (``Source.raw``)


def changing(found: list[Source], keys: list[tuple]) -> list[str]:
    """The names of the values whose part differs between ``keys`` (a module's or object's settings by
    attribute), for a message."""
    names = []
    for i, source in enumerate(found):
        parts = [key[i] for key in keys]
        if all(p == parts[0] for p in parts):
            continue
        # (submodule, attribute) -> its key part, per key
        settings = [{(j, k): v for j, (_, row) in enumerate(_rows(p)) for k, v in row} for p in parts]
        attrs = sorted({a for d in settings for a in d if any(e.get(a) != d.get(a) for e in settings)})
        names += list(dict.fromkeys(f"{source.name}.{k}" for _, k in attrs)) if attrs else [source.name]
    return names


def holds_modules(key: tuple) -> bool:
    return any(part is not _TENSOR and part[0] == "module" for part in key)


def quick_call(found: list[Source], key: tuple, tensors: list, jitted, fast_miss, missed):
    """A generated ``quick(args, kwargs)`` that reads the sources and, where they hold what ``key`` and
    ``tensors`` (this call's, from :func:`gather`) say, calls ``jitted`` (the key's ``JitFunction``) with
    their tensors and the arguments; else returns :data:`MISS`.  A value keyed as a tensor must be a plain
    tensor; a number, an equal one of the same type; a module, the same object with the same tree of
    submodules, parameters and buffers (each dictionary the same size, each entry the same object: an
    optimizer's in-place step keeps them) and ``training`` flags, which costs far less than
    ``named_parameters()``.  A positional call tries ``jitted``'s generated fast paths first (each returns
    ``fast_miss`` where its signature or guard fails, or raises ``missed`` where a speculative assertion
    does), as ``jitted`` itself would, without its second check for an enclosing trace.  None where ``key``
    holds a container, whose tensors take a flattening to collect."""
    if any(part is not _TENSOR and part[0] == "tree" for part in key):
        return None
    ns = {"Tensor": torch.Tensor, "Parameter": torch.nn.Parameter, "MISS": MISS, "J": jitted, "id": id,
          "FAST_MISS": fast_miss, "Missed": missed, "frozen": frozen}  # fmt: skip
    body, passed, taken = [], [], iter(tensors)
    for i, (source, part) in enumerate(zip(found, key)):
        ns[f"H{i}"] = source.root()
        body.append(f"v{i} = {source.expr(f'H{i}')}")
        if part is _TENSOR:
            body.append(f"if type(v{i}) is not Tensor and type(v{i}) is not Parameter: return MISS")
            passed.append(f"v{i}")
            next(taken)
        elif part is _FLOAT:
            body.append(f"if type(v{i}) is not float: return MISS")
            passed.append(f"v{i}")
            next(taken)
        elif part[0] == "module":
            checks, floats = _same_module(part[1], f"M{i}", f"v{i}", ns)
            body += checks
            for k in range(len(part[3])):
                ns[f"X{i}_{k}"] = next(taken)
                passed.append(f"X{i}_{k}")
            for f in floats:
                next(taken)
                passed.append(f)
        elif part[0] == "settings":
            ns[f"O{i}"] = part[1]
            checks, floats = _same_settings(part[1], f"O{i}", ns)
            body += [f"if v{i} is not O{i}: return MISS", *checks]
            for f in floats:
                next(taken)
                passed.append(f)
        elif part[0] == "object" or part[0] is _ARRAY:
            body.append(f"if id(v{i}) != {part[1]}: return MISS")
        elif part[0] == "frozen":
            value = source.read()
            checks = _same_frozen(f"v{i}", part[1], ns, [])
            if _immutable(value) and frozen(value) == part[1]:  # (``STRIDES = (8, 16, 32)``) rebound, if at all
                ns[f"I{i}"], ns[f"K{i}"] = value, part[1]
                checks = [f"if v{i} is not I{i} and frozen(v{i}) != K{i}: return MISS"]
            elif len(checks) > _MAX_CHECKS:  # a long list: one call that freezes it instead
                ns[f"K{i}"], ns[f"F{i}"] = part[1], source.key
                checks = [f"if F{i}(v{i}) != K{i}: return MISS"]
            body += checks
        else:
            body.append(f"if {value_test(f'v{i}', part[2], ns)}: return MISS")
    call = "".join(p + ", " for p in passed)
    lines = ["def quick(args, kwargs):", "    try:", *(f"        {line}" for line in body),
             "    except (KeyError, AttributeError, ValueError):",  # a dictionary entry gone, a cell unbound
             "        return MISS",
             "    if not kwargs:",
             "        try:",
             "            for fast in J.fast:",
             f"                out = fast({call}*args)",
             "                if out is not FAST_MISS: return out",
             "        except Missed:",  # ``J`` takes the other paths
             "            pass",
             f"    return J({call}*args, **kwargs)"]  # fmt: skip
    exec("\n".join(lines), ns)  # noqa: S102
    return ns["quick"]


_TENSOR = ("tensor",)
_FLOAT = ("float",)


def _settings(module: torch.nn.Module) -> list[tuple[str, object]]:
    """A module's plain attributes that a forward may read as numbers (``self.temperature``, ``self.eps``,
    ``self.kernel_size``, a flag): baked into a trace, so they key it."""
    return [(k, v) for k, v in vars(module).items() if k != "training" and _is_setting(v)]


def _settings_key(obj, passed: list) -> tuple:
    """``obj``'s settings as a key part (a float as :data:`_FLOAT`, its value appended to ``passed``)."""
    part = []
    for k, v in _settings(obj):
        if type(v) is float:
            passed.append(v)
            part.append((k, _FLOAT))
        else:
            part.append((k, value_key(v)))
    return tuple(part)


def _rows(part) -> list[tuple[object, tuple]]:
    """The objects whose settings a key part holds, with their part of it: a module's submodules, or the
    object of a plain object's method."""
    if part is _TENSOR or part is _FLOAT:
        return []
    if part[0] == "module":
        return list(zip(part[1].modules(), part[4]))
    return [(part[1], part[2])] if part[0] == "settings" else []


def _is_setting(value) -> bool:
    if type(value) in _SETTINGS:
        return True
    return type(value) is tuple and all(_is_setting(x) for x in value)


_SETTINGS = (bool, int, float, complex, str, type(None), torch.dtype, torch.device)


def _same_module(module: torch.nn.Module, name: str, value: str, ns: dict) -> tuple[list[str], list[str]]:
    """Statements that return ``MISS`` unless ``value`` is ``module`` with its submodules, parameters,
    buffers, ``training`` flags and settings (``_same_settings``) as they are now; and the expressions of its
    float settings, which are passed."""
    body, floats = [f"if {value} is not {name}_0: return MISS"], []
    subs = list(module.modules())
    ids = {id(m): j for j, m in enumerate(subs)}
    for j, m in enumerate(subs):
        ns[f"{name}_{j}"] = m
        checks, mine = _same_settings(m, f"{name}_{j}", ns, [("training", m.training)])
        body += checks
        floats += mine
        for attr in ("_parameters", "_buffers", "_modules"):
            entries = getattr(m, attr)
            tests = [f"len(d) != {len(entries)}"]
            for k, (key, obj) in enumerate(entries.items()):
                if attr == "_modules" and obj is not None:
                    tests.append(f"d[{key!r}] is not {name}_{ids[id(obj)]}")
                else:
                    ns[f"{name}_{j}{attr}{k}"] = obj
                    tests.append(f"d[{key!r}] is not {name}_{j}{attr}{k}")
            body += [f"d = {name}_{j}.{attr}", f"if {' or '.join(tests)}: return MISS"]
    return body, floats


def _same_settings(obj, name: str, ns: dict, first: list = ()) -> tuple[list[str], list[str]]:
    """Statements that return ``MISS`` unless the object ``ns[name]`` has as many attributes as ``obj`` now
    and its settings (``_settings``, after the pairs ``first``) of the same type and equal, its floats floats;
    and the expressions of those floats, which are passed (their values are the trace's business:
    ``JitFunction.dynamic_floats``).  One C-level fetch of them all and one compare of those not passed, then
    the numbers' types (``2 == 2.0 == True``)."""
    settings = _settings(obj)
    kept = [*first, *((k, v) for k, v in settings if type(v) is not float)]
    checked = [*kept, *((k, v) for k, v in settings if type(v) is float)]
    if not checked:
        return [f"if len({name}.__dict__) != {len(vars(obj))}: return MISS"], []
    get, got = f"{name}_get", f"{name}_s"
    keys = [k for k, _ in checked]
    ns[get] = operator.itemgetter(*keys) if len(keys) > 1 else lambda d, k=keys[0]: (d[k],)
    ns[f"{get}V"] = tuple(v for _, v in kept)
    tests = [f"{got}[:{len(kept)}] != {get}V" if len(kept) < len(checked) else f"{got} != {get}V"]
    floats = []
    for k, (_, v) in enumerate(checked):
        if type(v) in (bool, int, float, complex):
            ns[f"{get}T{k}"] = type(v)
            tests.append(f"type({got}[{k}]) is not {get}T{k}")
        if type(v) is float:
            floats.append(f"{got}[{k}]")
    body = [f"a = {name}.__dict__", f"if len(a) != {len(vars(obj))}: return MISS", f"{got} = {get}(a)",
            f"if {' or '.join(tests)}: return MISS"]  # fmt: skip
    return body, floats


def _static(value):
    """A value's part of the key: the value itself where it is hashable, else the object (an array, whose
    trace :func:`lifted` refuses)."""
    if isinstance(value, np.ndarray):
        return (_ARRAY, id(value))
    try:
        hash(value)
    except TypeError:
        return ("object", id(value))
    return ("value", *value_key(value))


_ARRAY = ("array",)


def frozen(value, path: frozenset = frozenset()):
    """A value read for its numbers (a container's, an object's attributes, nested), as a key: each a
    :func:`_static`; a tensor by identity; a plain object (:func:`plain_object`) by its type and what it holds,
    which its methods and the functions it is passed to read too.  ``path``: the ids of the containers and
    objects it is inside (one met again is keyed by identity: a cycle)."""
    kind = type(value)
    if kind in _NUMBERS:  # (the most values: ahead of the tests below)
        return ("value", *value_key(value))
    if kind in _CONTAINERS or _plain_type(kind):
        if id(value) in path:
            return ("cycle", id(value))
        path = path | {id(value)}
        if kind is dict:
            return (dict, *[(k, frozen(v, path)) for k, v in value.items()])
        if kind is not list and kind is not tuple:
            return _object_part(value, path)
        return (kind, *[frozen(x, path) for x in value])
    if isinstance(value, torch.Tensor):  # (its ``==`` is elementwise) read by the trace, it makes the call fall back
        return ("tensor", id(value))
    if kind is types.ModuleType and _users(value):
        return _module_part(value, path)
    return _static(value)


def _module_part(module: types.ModuleType, path: frozenset) -> tuple:
    """A module of the user's (``import consts``, passed or used whole) keyed as a plain object is: by what its
    names hold (not its dunders), each frozen, so ``consts.K = 4.0`` traces again."""
    if id(module) in path:
        return ("cycle", id(module))
    path = path | {id(module)}
    return (_MODULE, module.__name__, tuple((k, frozen(v, path)) for k, v in vars(module).items()
                                            if not (k.startswith("__") and k.endswith("__"))))  # fmt: skip


_MODULE = ("module object",)


_NUMBERS = frozenset((*_SCALARS, type(None)))
_STATE = ("state",)
_NAMESPACES = (types.SimpleNamespace, argparse.Namespace)


def plain_object(value) -> bool:
    """Whether ``value`` is an object of the user's classes (a module too), a namespace (``SimpleNamespace``,
    ``argparse.Namespace``) or a module object of the user's: what a function reads of it is what it holds,
    keyed by :func:`frozen`."""
    return _plain_type(type(value)) or (type(value) is types.ModuleType and _users(value))


@functools.lru_cache(maxsize=1024)
def _plain_type(kind: type) -> bool:
    """:func:`plain_object` of ``kind``'s objects (not classes, modules, enums' members, which hold one value)."""
    if issubclass(kind, (type, types.ModuleType, enum.Enum)):
        return False
    return kind in _NAMESPACES or _users(kind)


@functools.lru_cache(maxsize=1024)
def _user_classes(kind: type) -> tuple[tuple[type, tuple], ...]:
    """The user's classes among ``kind``'s bases, each with its slots."""
    found = []
    for c in kind.__mro__:
        if c is not object and _users(c):
            slots = c.__dict__.get("__slots__", ())
            found.append((c, tuple(k for k in ((slots,) if isinstance(slots, str) else slots) if k != "__dict__")))
    return tuple(found)


def _object_part(obj, path: frozenset, floats: bool = True) -> tuple:
    """A plain object's :func:`frozen` part: ``(_STATE, its type, its ``__dict__``'s items (None where it has
    none), its slots' items, per user class of it the numbers, strings and containers the class holds)`` (a
    class's: ``Config.scale`` read as ``cfg.scale``), each value frozen."""
    own = getattr(obj, "__dict__", None)
    mine = None
    if type(own) is dict:  # (without ``floats``, its own floats as :data:`_FLOAT`: passed, not keyed)
        mine = tuple((k, _FLOAT if not floats and type(v) is float else frozen(v, path)) for k, v in own.items())
    kinds = _user_classes(type(obj))
    slots = tuple((k, frozen(getattr(obj, k, UNBOUND), path)) for _, names in kinds for k in names)
    classes = tuple((c, tuple((k, frozen(v, path)) for k, v in vars(c).items() if _class_setting(k, v)))
                    for c, _ in kinds)  # fmt: skip
    return (_STATE, type(obj), mine, slots, classes)


def _class_setting(name: str, value) -> bool:
    """Whether a class attribute keys its objects: a setting or container (not a dunder's) or a method, by
    identity (one patched on the class later: ``Scaler.apply = ...``, ``__call__`` too)."""
    if isinstance(value, (types.FunctionType, staticmethod, classmethod)):
        return True
    return not name.startswith("_") and (_is_setting(value) or type(value) in _CONTAINERS)


def _same_frozen(var: str, part, ns: dict, body: list) -> list[str]:
    """Statements, into ``body``, that return ``MISS`` unless the variable ``var`` holds a value that
    :func:`frozen` makes ``part``: each container's type and length, each number's type and value."""
    head = part[0]
    if (head is list or head is tuple) and all(p[0] == "value" and not (p[1] is float and p[2] == 0) for p in part[1:]):
        # flat (and no zero float, whose sign == does not see): one compare of the values, one of their types
        ns[f"C_{var}"], ns[f"T_{var}"] = head(p[2] for p in part[1:]), tuple(p[1] for p in part[1:])
        body.append(f"if type({var}) is not {head.__name__} or {var} != C_{var} or tuple(map(type, {var})) != "
                    f"T_{var}: return MISS")  # fmt: skip
    elif head is list or head is tuple or head is dict:
        body.append(f"if type({var}) is not {head.__name__} or len({var}) != {len(part) - 1}: return MISS")
        for k, child in enumerate(part[1:]):
            if head is dict:  # (a key gone raises KeyError: the call misses)
                ns[f"K_{var}_{k}"], child = child
                body.append(f"{var}_{k} = {var}[K_{var}_{k}]")
            else:
                body.append(f"{var}_{k} = {var}[{k}]")
            _same_frozen(f"{var}_{k}", child, ns, body)
    elif head == "value":
        body.append(f"if {value_test(var, part[2], ns)}: return MISS")
    elif part is _FLOAT:  # (passed: its type alone)
        body.append(f"if type({var}) is not float: return MISS")
    elif head is _STATE:  # a plain object: its type, then what it holds, as a dict's items
        _same_object(var, part, ns, body)
    elif head is _MODULE:  # (a module's dunders are left out: one compare of it frozen whole)
        ns[f"S_{var}"] = part
        body.append(f"if frozen({var}) != S_{var}: return MISS")
    else:  # an object or an array, by identity
        body.append(f"if id({var}) != {part[1]}: return MISS")
    return body


def _same_object(var: str, part: tuple, ns: dict, body: list) -> None:
    """:func:`_same_frozen` of a plain object's part (``_object_part``): its type, its ``__dict__``'s size and
    items, its slots, and each of its classes' names and settings (a class's names compared whole: a setting
    added to it is seen)."""
    _, kind, mine, slots, classes = part
    if any(
        {k for k, v in vars(c).items() if _class_setting(k, v)} != {k for k, _ in settings} for c, settings in classes
    ):
        ns[f"S_{var}"] = part  # a class changed since the part was taken: compared whole
        body.append(f"if frozen({var}) != S_{var}: return MISS")
        return
    ns[f"T_{var}"], ns["UNBOUND"] = kind, UNBOUND
    body.append(f"if type({var}) is not T_{var}: return MISS")
    if mine is not None:
        body += [f"{var}_d = {var}.__dict__", f"if len({var}_d) != {len(mine)}: return MISS"]
    items = [(f"{var}_d[{{}}]", name, child) for name, child in mine or ()]
    items += [(f"getattr({var}, {{}}, UNBOUND)", name, child) for name, child in slots]
    for j, (c, settings) in enumerate(classes):
        ns[f"C_{var}_{j}"], ns[f"N_{var}_{j}"] = vars(c), frozenset(vars(c))
        body.append(f"if C_{var}_{j}.keys() != N_{var}_{j}: return MISS")
        items += [(f"C_{var}_{j}[{{}}]", name, child) for name, child in settings]
    for k, (read, name, child) in enumerate(items):
        ns[f"K_{var}_{k}"] = name
        body.append(f"{var}_{k} = {read.format(f'K_{var}_{k}')}")
        _same_frozen(f"{var}_{k}", child, ns, body)


def _immutable(value) -> bool:
    """A tuple of numbers, strings and tuples of them: the same object holds the same values."""
    return type(value) is tuple and all(type(x) in _SCALARS or x is None or _immutable(x) for x in value)


#: Statements a generated call spends on a captured container's numbers before it freezes the container whole.
_MAX_CHECKS = 128


def _arrays(found: list[Source], key: tuple) -> list[str]:
    """The names of the sources whose key part holds a numpy array."""
    return [source.name for source, part in zip(found, key) if holds_array(part)]


def holds_array(part) -> bool:
    """Whether a key part (:func:`frozen`'s) holds a numpy array."""
    return part is _ARRAY or (type(part) is tuple and any(holds_array(p) for p in part))


class CapturedArray(RuntimeError):
    """The function reads a numpy array from outside its arguments: a trace would bake in its contents, which
    may change in place (guarding them would cost a pass over the array at every call)."""


def value_key(value) -> tuple:
    """A hashable value as a key: its type and value, and a float's sign (``-0.0 == 0.0``, but ``1 / -0.0`` is
    ``-inf``)."""
    return (type(value), value, math.copysign(1.0, value)) if type(value) is float else (type(value), value)


def value_test(name: str, value, ns: dict) -> str:
    """Generated code that is true where the variable ``name`` differs from ``value`` (its key, ``value_key``):
    another type, an unequal value or the other zero.  Binds its constants in ``ns``."""
    ns[f"T_{name}"], ns[f"V_{name}"] = type(value), value
    test = f"type({name}) is not T_{name} or {name} != V_{name}"
    if type(value) is float and value == 0.0:
        ns["copysign"] = math.copysign
        test += f" or copysign(1.0, {name}) != {math.copysign(1.0, value)}"
    return test


def _count(part) -> int:
    if part is _TENSOR or part is _FLOAT:
        return 1
    if part[0] == "tree":
        return sum(x is None for x in part[2])
    floats = sum(v is _FLOAT for _, row in _rows(part) for _, v in row)
    return len(part[3]) + floats if part[0] == "module" else floats


class _Modules(torch.nn.Module):
    """The captured modules as children, so that one ``functional_call`` hands all their parameters and
    buffers over (tied weights kept tied) while the function runs."""

    def __init__(self, modules: list):
        super().__init__()
        for i, m in enumerate(modules):
            self.add_module(f"m{i}", m)

    def forward(self, fn, args, kwargs):
        return fn(*args, **kwargs)


def lifted(fn, found: list[Source], key: tuple):
    """``fn`` with the tensors of ``key``'s sources as leading arguments: a copy of ``fn`` whose closure
    cells and globals hold them, its modules reparametrised with them.  Its signature is ``fn``'s with those
    arguments first, so static argument names keep their positions."""
    counts = [_count(part) for part in key]
    n = sum(counts)
    modules = [part[1] for part in key if part[0] == "module"]
    holder = _Modules(modules) if modules else None

    arrays = _arrays(found, key)

    def call(*args, **kwargs):
        if arrays:
            raise CapturedArray(
                f"it reads the numpy array {', '.join(arrays)} from outside its arguments, whose contents a trace "
                "would bake in: pass it as an argument, or capture torch.from_numpy(array), a tensor that shares "
                "its memory and is read at every call"
            )
        tensors, args = iter(args[:n]), args[n:]
        values, params, shown, m = {}, {}, {}, 0  # shown: a key of ``params`` -> its name in messages
        original = {source: source.raw() for source in found}
        wholes = {source: _held(source.raw()) for source in found if source.kind == "attr" and not source.path}
        held = {source: None if v is UNBOUND else v for source, v in original.items()}
        swapped = []  # (a module's __dict__, a float setting, the value passed) while the function runs
        for source, part, count in zip(found, key, counts):
            mine = [next(tensors) for _ in range(count)]
            if part is _TENSOR or part is _FLOAT:
                values[source] = mine[0]
            elif part[0] == "tree":
                leaves, spec = pytree.tree_flatten(held[source])
                it = iter(mine)
                values[source] = pytree.tree_unflatten([next(it) if x is None else v for x, v in zip(part[2], leaves)],
                                                       spec)  # fmt: skip
            else:
                if part[0] == "module":
                    params.update({f"m{m}.{name}": t for name, t in zip(part[3], mine)})
                    shown.update({f"m{m}.{name}": f"{source.name}.{name}" for name in part[3]})
                    mine, m = mine[len(part[3]) :], m + 1
                floats = iter(mine)  # (after a module's parameters and buffers)
                for obj, row in _rows(part):
                    swapped += [(vars(obj), k, next(floats), source.name) for k, v in row if v is _FLOAT]
        target = _with_values(fn, values)
        held.update(values)
        passed = dict(params)
        before = [d[k] for d, k, _, _ in swapped]
        try:  # the modules' float settings hold the values passed (symbols where the trace reads them), as
            for d, k, v, _ in swapped:  # functional_call swaps their parameters
                d[k] = v
            if holder is None:
                out = target(*args, **kwargs)
            else:  # (``functional_call`` writes what the module holds at the end back into ``params``)
                out = torch.func.functional_call(holder, params, (target, args, kwargs))
        finally:
            rebound = [f"{name}.{k}" for d, k, v, name in swapped if d.get(k, UNBOUND) is not v]
            for (d, k, _, _), v in zip(swapped, before):
                d[k] = v
        # (a helper function a global holds is a copy in ``target``'s globals, reading the values passed)
        rebound += [source.name for source in found if not isinstance(held[source], types.FunctionType)
                    and source.changed(_now(fn, target, source), held[source])]  # fmt: skip
        rebound += [shown[k] for k, t in passed.items() if params[k] is not t]
        rebound += _settings_set(found, key)
        rebound += [source.name for source, held in wholes.items() if _changed_back(source.raw(), held)]
        for source in found:  # the trace ran ``fn`` itself where it passed no tensor: undo its assignments
            if source.kind != "self" and source.changed(source.raw(), original[source]):
                source.write(original[source])
        if rebound:
            raise Rebound(
                f"it assigns a new value to {', '.join(rebound)}, which it reads from outside its arguments: a "
                "trace cannot carry the assignment out of the call (an in-place update such as add_() can)"
            )
        return out

    call.__qualname__ = getattr(fn, "__qualname__", type(fn).__qualname__)
    call.__name__ = getattr(fn, "__name__", type(fn).__name__)
    call.__wrapped__ = fn
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        pass
    else:
        leading = [inspect.Parameter(f"_captured{i}", inspect.Parameter.POSITIONAL_ONLY) for i in range(n)]
        call.__signature__ = signature.replace(parameters=[*leading, *signature.parameters.values()])
    return call


def _held(obj) -> tuple:
    """What a captured object used whole holds before a trace: its key part and its own attributes."""
    own = getattr(obj, "__dict__", None)
    return frozen(obj), dict(own) if type(own) is dict else None


def _changed_back(obj, held: tuple) -> bool:
    """Whether the trace changed what ``obj`` holds (``_held``); its own attributes are put back (the call
    that falls back then changes them once, as eager does; a nested object's are not)."""
    part, own = held
    if frozen(obj) == part:
        return False
    if own is not None:
        obj.__dict__.clear()
        obj.__dict__.update(own)
    return True


def _settings_set(found: list[Source], key: tuple) -> list[str]:
    """The settings of the captured modules and objects that the traced call changed (``self.calls += 1``),
    as names; each is put back as it was (the call that falls back then changes it once, as eager does)."""
    changed = []
    for source, part in zip(found, key):
        for obj, before in _rows(part):
            floats = {k for k, v in before if v is _FLOAT}  # passed, put back by ``lifted`` itself
            was, now = {k: v for k, v in before if k not in floats}, vars(obj)
            after = {k: value_key(v) for k, v in _settings(obj) if k not in floats}
            for k in sorted(after.keys() | was.keys()):
                if after.get(k) != was.get(k):
                    changed.append(f"{source.name}.{k}")
                    if k in was:
                        now[k] = was[k][1]  # (a key is the value's type, the value, maybe its sign)
                    else:
                        del now[k]
    return changed


class Rebound(RuntimeError):
    """The traced function assigned a new value to one of its captured values (``self.count = self.count +
    1``, ``global STEP; STEP += 1``): eager keeps the new value, a trace would drop it."""


def _now(fn, target, source: Source):
    """What ``source`` holds now, as ``target`` (``fn`` or its copy) sees it."""
    if source.kind == "self" or isinstance(target, torch.nn.Module):  # (a module's globals are not copied)
        return source.read()
    func = target.__func__ if inspect.ismethod(target) else target
    if source.kind == "cell":
        return func.__closure__[func.__code__.co_freevars.index(source.name)].cell_contents
    original = fn.__func__ if inspect.ismethod(fn) else fn
    if source.holder is not original.__globals__:  # another module's globals: never copied
        return source.read()
    return func.__globals__.get(source.name)


def _with_values(fn, values: dict):
    """``fn``, or a copy of it whose closure cells and globals hold ``values`` (source -> value)."""
    if not values:
        return fn
    method = fn if inspect.ismethod(fn) else None
    func = fn.__func__ if method else fn
    cells = {s.name: v for s, v in values.items() if s.kind == "cell"}
    closure = func.__closure__
    if cells:
        closure = tuple(types.CellType(cells[name]) if name in cells else cell
                        for name, cell in zip(func.__code__.co_freevars, closure))  # fmt: skip
    env = func.__globals__
    names = {s.name: v for s, v in values.items() if s.kind == "global"}
    if names:  # the module's functions that ``fn`` calls read them too: copies of those read the new globals
        helpers = _helpers(func.__code__, env)
        env = {**env, **names}
        env.update({name: _copy(helper, env, helper.__closure__) for name, helper in helpers.items()})
    copy = _copy(func, env, closure)
    return types.MethodType(copy, method.__self__) if method else copy


def _copy(func: types.FunctionType, env: dict, closure) -> types.FunctionType:
    copy = types.FunctionType(func.__code__, env, func.__name__, func.__defaults__, closure)
    copy.__kwdefaults__ = func.__kwdefaults__
    return copy
