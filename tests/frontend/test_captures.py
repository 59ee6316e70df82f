"""Values a ``tailjit.jit`` function reads from outside its arguments and that change after a call: numbers in
captured containers, arrays, class, module and object attributes, default arguments.  Each was baked into
the first trace and served stale afterwards; now each call's result is eager's."""

from __future__ import annotations

import dataclasses
import functools
import types
import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import tailjit
from tailjit.frontend.trace import captures

X = torch.randn(4, 3)


def _same_as_eager_after(f, change, calls: int = 2, jitted=None):
    """``f`` jitted is called, ``change()`` runs, and the next calls equal eager ``f``'s."""
    g = jitted or tailjit.jit(f)
    torch.testing.assert_close(g(X), f(X))
    change()
    for _ in range(calls):
        torch.testing.assert_close(g(X), f(X))
    return g


SCALES = [2.0, [3, {"k": (0.5, 1)}]]


def test_numbers_in_a_captured_list_dict_and_tuple_nested():
    def f(t):
        return t * SCALES[0] + SCALES[1][0] - t * SCALES[1][1]["k"][0] ** SCALES[1][1]["k"][1]

    def change():
        SCALES[0] = 5.0
        SCALES[1][1]["k"] = (2.0, 2)

    g = _same_as_eager_after(f, change)
    assert g._quick.__name__ == "quick"  # numbers alone: a generated call reads them, no flattening
    SCALES[1][0] = 4
    torch.testing.assert_close(g(X), f(X))


def test_a_number_in_a_closure_list_and_the_type_of_a_changed_number():
    box = [2]

    def f(t):
        return (t * 10).to(torch.int64) * box[0]

    _same_as_eager_after(f, lambda: box.__setitem__(0, 2.5))  # an int's trace must not serve a float


ARRAY = np.full(3, 2.0, dtype=np.float32)


def test_a_numpy_array_read_from_globals_and_changed_in_place_falls_back_with_a_message():
    """Guarding an array's contents would cost a pass over it at every call, and handing the trace a tensor for
    it would change what the code sees: the function takes torch.compile, which reads the array at each call."""

    def f(t):
        return t * torch.from_numpy(ARRAY)

    with pytest.warns(UserWarning, match=r"numpy array ARRAY .* pass it as an argument, or capture torch.from_numpy"):
        _same_as_eager_after(f, lambda: ARRAY.__setitem__(0, 7.0))


def test_a_numpy_array_in_a_closure_container():
    arrays = {"w": np.ones(3, dtype=np.float32)}

    def f(t):
        return t + torch.from_numpy(arrays["w"])

    with pytest.warns(UserWarning, match="numpy array arrays"):
        _same_as_eager_after(f, lambda: arrays["w"].__setitem__(1, -4.0))


class Config:
    scale = 2.0


class Holder:
    pass


cfg = Holder()
cfg.scale = 2.0
cfg.inner = Holder()
cfg.inner.offset = 1


def test_a_class_attribute_patched_later():
    g = _same_as_eager_after(lambda t: t * Config.scale, lambda: setattr(Config, "scale", 5.0))
    assert g._quick.__name__ == "quick"
    Config.scale = 2.0


def test_an_objects_attributes_changed_later_nested_too():
    def f(t):
        return t * cfg.scale + cfg.inner.offset

    def change():
        cfg.scale = -1.5
        cfg.inner.offset = 3

    _same_as_eager_after(f, change)
    cfg.inner = Holder()  # another object in the chain
    cfg.inner.offset = 7
    torch.testing.assert_close(tailjit.jit(f)(X), f(X))


def test_an_attribute_of_an_object_in_a_closure_read_in_a_comprehension():
    def make(c):
        return lambda t: sum(t * c.scale for _ in range(2))

    c = Holder()
    c.scale = 2.0
    f = make(c)
    _same_as_eager_after(f, lambda: setattr(c, "scale", -3.0))


consts = types.ModuleType("consts")  # a module of constants, as ``math`` is
consts.SCALE = 2.0


def test_a_module_constant_patched_with_setattr():
    _same_as_eager_after(lambda t: t * consts.SCALE, lambda: setattr(consts, "SCALE", 4.0))


class Loss:
    gain = 2.0  # a class attribute, read through self

    def __init__(self):
        self.cfg = Holder()
        self.cfg.k = 1.0

    def __call__(self, t):
        return t * self.gain + self.cfg.k


def test_a_callable_objects_class_attribute_and_attribute_of_an_attribute():
    loss = Loss()
    g = _same_as_eager_after(loss, lambda: setattr(Loss, "gain", 5.0), jitted=tailjit.jit(loss))
    _same_as_eager_after(loss, lambda: setattr(loss.cfg, "k", -3.0), jitted=g)
    _same_as_eager_after(loss, lambda: setattr(loss, "gain", 0.5), jitted=g)  # now the instance's own


class Scaled(torch.nn.Module):
    scale = 2.0

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(3, 3)

    def forward(self, t):
        return self.lin(t) * self.scale


def test_a_modules_class_attribute_and_its_submodules():
    net = torch.nn.Sequential(Scaled(), Scaled())
    with torch.no_grad():
        _same_as_eager_after(net, lambda: setattr(Scaled, "scale", -1.0), jitted=tailjit.jit(net))
    Scaled.scale = 2.0


def test_default_argument_values_changed_in_place():
    def f(t, scales=[2.0], *, shift={"by": 1.0}):  # noqa: B006 - the mutable defaults are the point
        return t * scales[0] + shift["by"]

    def change():
        scales, shift = f.__defaults__[0], f.__kwdefaults__["shift"]
        scales[0] = 3.0
        shift["by"] = -2.0

    _same_as_eager_after(f, change)


def test_an_attribute_the_function_assigns_is_carried_out_as_eager_does():
    state = Holder()
    state.calls = 0

    def f(t):
        state.calls += 1
        return t * state.calls

    g = tailjit.jit(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = [g(X) for _ in range(3)]
    assert state.calls == 3
    for k, out in enumerate(got, 1):
        torch.testing.assert_close(out, X * k)


BOX = [1.0]


@settings(max_examples=12, deadline=None)
@given(st.lists(st.one_of(st.integers(-3, 3), st.floats(-4, 4), st.just(-0.0), st.booleans()), min_size=1, max_size=3))
def test_any_sequence_of_numbers_in_a_captured_list_gives_eagers_answers(values):
    g = tailjit.jit(lambda t: 1 / (t * 0 + BOX[0]) + t * BOX[0])
    for v in values:
        BOX[0] = v
        torch.testing.assert_close(g(X), 1 / (X * 0 + v) + X * v, equal_nan=True)


class Schedule:
    def __init__(self):
        self.step = 1

    @property
    def scale(self):  # a new float at every read
        return self.step * 0.5


schedule = Schedule()


def test_a_property_is_read_at_every_call_and_not_taken_for_an_assignment():
    g = _same_as_eager_after(lambda t: t * schedule.scale, lambda: setattr(schedule, "step", 4))
    assert g.fallback is None, g.fallback_reason


class Anchored(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.sizes = [2.0, 3.0]  # not a setting (a list): read for its numbers
        self.cfg = Holder()
        self.cfg.bias = 0.5

    def forward(self, t):
        return t * self.sizes[0] + self.sizes[1] + self.cfg.bias


def test_a_modules_list_attribute_and_an_objects_attribute_changed_in_place():
    net = Anchored()

    def change():
        net.sizes[0] = -1.0
        net.cfg.bias = 4.0

    _same_as_eager_after(net, change, jitted=tailjit.jit(net))


STRIDES = (8, 16)


def test_a_global_tuple_of_numbers_rebound():
    global STRIDES

    def f(t):
        return t * STRIDES[0] + STRIDES[1]

    def change():
        global STRIDES
        STRIDES = (1, 2)

    _same_as_eager_after(f, change)
    STRIDES = (8, 16)


# -- plain objects passed as arguments: keyed by what they hold, however the function reads it ---------------


def _with(**attrs) -> Holder:
    obj = Holder()
    vars(obj).update(attrs)
    return obj


def _helper(t, c):  # reads the object in a function the jitted one calls
    return t * c.k


def test_an_attribute_of_an_object_argument_changed_later():
    """``c.k``, ``c.sub.k``, ``c.items[0]`` and ``c.k`` read by a helper the object is passed to: each baked
    into the first trace and served stale afterwards, keyed by the object's identity alone."""
    cases = [
        (lambda t, c: t * c.k, lambda c: setattr(c, "k", 5.0)),
        (lambda t, c: t * c.sub.k, lambda c: setattr(c.sub, "k", 5)),
        (lambda t, c: t * c.items[0], lambda c: c.items.__setitem__(0, -1.5)),
        (lambda t, c: _helper(t, c) + 1, lambda c: setattr(c, "k", 3)),
        (lambda t, c: t * getattr(c, "k"), lambda c: setattr(c, "k", 0.25)),  # noqa: B009 - a read unseen in bytecode
    ]
    for f, change in cases:
        c = _with(k=2.0, sub=_with(k=2.0), items=[2.0])
        g = tailjit.jit(f)
        torch.testing.assert_close(g(X, c), f(X, c))
        change(c)
        for _ in range(2):
            torch.testing.assert_close(g(X, c), f(X, c))
        assert g.fallback is None, g.fallback_reason


def test_an_equal_object_argument_reuses_the_trace():
    g = tailjit.jit(lambda t, c: t * c.k)
    g(X, _with(k=2.0))
    torch.testing.assert_close(g(X, _with(k=2.0)), X * 2.0)
    assert len(g.reports) == 1


@dataclasses.dataclass
class Settings:  # eq=True: unhashable, so it used to be refused as a static argument
    k: float = 2.0
    mode: str = "mul"

    def apply(self, t):
        return t * self.k if self.mode == "mul" else t + self.k


@dataclasses.dataclass(slots=True)
class Slotted:
    k: float = 2.0


def test_a_dataclass_argument_its_method_and_a_slotted_one():
    s = Settings()
    g = tailjit.jit(lambda t, c: c.apply(t))
    torch.testing.assert_close(g(X, s), s.apply(X))
    s.mode = "add"
    torch.testing.assert_close(g(X, s), X + 2.0)
    slotted = Slotted()
    h = tailjit.jit(lambda t, c: t * c.k)
    torch.testing.assert_close(h(X, slotted), X * 2.0)
    slotted.k = 3.0
    torch.testing.assert_close(h(X, slotted), X * 3.0)


class Gain:
    gain = 2.0


def test_a_class_attribute_read_through_an_object_argument():
    g = tailjit.jit(lambda t, c: t * c.gain)
    obj = Gain()
    torch.testing.assert_close(g(X, obj), X * 2.0)
    Gain.gain = -1.0
    try:
        torch.testing.assert_close(g(X, obj), X * -1.0)
    finally:
        Gain.gain = 2.0


class Shift(torch.nn.Module):  # no parameters: nothing of it is an input of the trace
    def __init__(self):
        super().__init__()
        self.eps = 1.0

    def forward(self, t):
        return t + self.eps


def test_a_parameterless_module_argument_whose_setting_changes():
    shift = Shift()
    g = tailjit.jit(lambda t, m: m(t))
    torch.testing.assert_close(g(X, shift), X + 1.0)
    shift.eps = 7.0
    torch.testing.assert_close(g(X, shift), X + 7.0)


def test_a_tensor_in_an_object_argument_is_read_at_every_call():
    c = _with(w=torch.ones(3))
    g = tailjit.jit(lambda t, c: t * c.w)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (it falls back: the trace is given the arguments' tensors only)
        torch.testing.assert_close(g(X, c), X)
        c.w.fill_(3.0)
        torch.testing.assert_close(g(X, c), X * 3.0)


NS = types.SimpleNamespace(model=Shift(), scale=2.0)


def test_a_modules_setting_reached_through_a_namespace():
    def f(t):
        return t * NS.scale + NS.model.eps

    def change():
        NS.model.eps = 7.0
        NS.scale = -1.0

    _same_as_eager_after(f, change)


OBJ = _with(k=2.0)
SHIFTS = types.SimpleNamespace(model=Shift())


def test_a_captured_object_passed_to_a_helper_or_called_is_keyed_by_what_it_holds():
    """The function hands the object (``OBJ``, ``SHIFTS.model``, ``settings``) to code its own bytecode does
    not show (a helper's argument, a module's forward, a method): what the object holds keys the trace."""
    settings = Settings()
    cases = [
        (lambda t: _helper(t, OBJ), lambda: setattr(OBJ, "k", 5.0)),
        (lambda t: SHIFTS.model(t), lambda: setattr(SHIFTS.model, "eps", -2.0)),
        (lambda t: settings.apply(t), lambda: setattr(settings, "mode", "add")),
        (lambda t: _helper(t, slotted), lambda: setattr(slotted, "k", 5.0)),
        (lambda t: _gained(t, gain), lambda: setattr(Gain, "gain", -1.0)),
    ]
    slotted, gain = Slotted(), Gain()
    try:
        for f, change in cases:
            g = _same_as_eager_after(f, change)
            assert g._quick.__name__ == "quick"  # (its generated check reads the object's attributes)
    finally:
        Gain.gain = 2.0


def _gained(t, c):
    return t * c.gain


def test_a_function_that_assigns_to_its_arguments_attribute_keeps_eagers_state():
    """A trace runs the assignment once, while tracing; the calls it served later would not."""
    state = _with(calls=0)

    def f(t, s):
        s.calls += 1
        return t * s.calls

    g = tailjit.jit(f)
    with pytest.warns(UserWarning, match=r"changes what its argument Holder holds"):
        outs = [g(X, state) for _ in range(3)]
    state.calls = 0
    outs.append(g(X, state))
    assert state.calls == 1
    for k, out in zip([1, 2, 3, 1], outs):
        torch.testing.assert_close(out, X * k)


def test_a_numpy_array_in_an_object_argument_is_refused_with_a_message():
    c = _with(arr=np.ones(3, dtype=np.float32))
    with pytest.raises(TypeError, match="argument Holder holds a numpy array.*torch.from_numpy"):
        tailjit.jit(lambda t, c: t * torch.from_numpy(c.arr))(X, c)


def test_a_static_object_argument_changed_later():
    c = _with(k=2.0)
    g = tailjit.jit(lambda t, c: t * c.k, static_argnums=(1,))
    torch.testing.assert_close(g(X, c), X * 2.0)
    c.k = -4.0
    torch.testing.assert_close(g(X, c), X * -4.0)


@settings(max_examples=10, deadline=None)
@given(st.lists(st.one_of(st.integers(-3, 3), st.floats(-4, 4), st.booleans(), st.none()), min_size=1, max_size=3))
def test_any_sequence_of_values_of_an_object_arguments_attribute_gives_eagers_answers(values):
    def f(t, c):
        return t * 2 if c.k is None else t * c.k + c.k

    g, c = tailjit.jit(f), _with(k=None)
    for v in values:
        c.k = v
        torch.testing.assert_close(g(X, c), f(X, c))


def _bump(t, s):
    s.calls += 1
    return t * s.calls


def test_a_captured_object_a_helper_changes_keeps_eagers_state():
    """The trace's change is put back and the function takes torch.compile: a state seen before no longer
    reuses a trace that would leave the object alone."""
    state = _with(calls=0)
    g = tailjit.jit(lambda t: _bump(t, state))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outs = [g(X) for _ in range(3)]
        state.calls = 0
        outs.append(g(X))
    assert state.calls == 1
    for k, out in zip([1, 2, 3, 1], outs):
        torch.testing.assert_close(out, X * k)


def _act(t):
    return t * 2


def test_a_global_helper_function_rebound_later():
    global _act

    def f(t):
        return _act(t) + 1

    def change():
        global _act

        def _act(t):
            return t * 10

    before = _act
    try:
        _same_as_eager_after(f, change)
    finally:
        _act = before


def test_a_helper_function_in_a_closure_rebound_later():
    act = torch.tanh

    def f(t):
        return act(t) * 2

    def change():
        nonlocal act

        def act(t):
            return t - 3

    _same_as_eager_after(f, change)


class _Scaler:
    def __init__(self):
        self.k = 2.0

    def apply(self, t):
        return t * self.k

    def __call__(self, t):
        return t + self.k


_SCALER = _Scaler()


def test_a_method_patched_on_the_class_of_a_captured_object():
    apply, call = _Scaler.apply, _Scaler.__call__

    def f(t):
        return _SCALER.apply(t) - _SCALER(t)

    def change():
        _Scaler.apply = lambda self, t: t * 3.0 + self.k
        _Scaler.__call__ = lambda self, t: t * self.k

    try:
        _same_as_eager_after(f, change)
    finally:
        _Scaler.apply, _Scaler.__call__ = apply, call


_PARTIAL = functools.partial(torch.add, alpha=2)


def test_a_global_partial_rebound_later():
    global _PARTIAL

    def f(t):
        return _PARTIAL(t, t)

    def change():
        global _PARTIAL
        _PARTIAL = functools.partial(torch.add, alpha=3)

    before = _PARTIAL
    try:
        _same_as_eager_after(f, change)
    finally:
        _PARTIAL = before


def test_a_module_object_argument_keys_by_its_settings():
    consts = types.ModuleType("consts")
    consts.K, consts.SHIFTS = 2.0, [1, 2]

    def f(t, m):
        return t * m.K + m.SHIFTS[1]

    g = tailjit.jit(f)
    torch.testing.assert_close(g(X, consts), f(X, consts))
    consts.K = 4.0
    torch.testing.assert_close(g(X, consts), f(X, consts))
    consts.SHIFTS[1] = 7
    torch.testing.assert_close(g(X, consts), f(X, consts))


def test_a_captured_module_object_used_whole_keys_by_its_settings():
    consts = types.ModuleType("consts")
    consts.K = 2.0

    def scale(t, m):
        return t * m.K

    _same_as_eager_after(lambda t: scale(t, consts), lambda: setattr(consts, "K", 3.0))


class _Loss:
    def __init__(self):
        self.cfg = types.SimpleNamespace(k=2.0, shifts=[1, 2])
        self.gain = 1.5

    def _scaled(self, t):
        return t * self.cfg.k + self.cfg.shifts[1]

    def through_a_method(self, t):
        return self._scaled(t) * self.gain

    def through_a_helper(self, t):
        return _read_cfg(self, t) * self.gain


def _read_cfg(loss, t):
    return t * loss.cfg.k - loss.cfg.shifts[0]


@pytest.mark.parametrize("method", ["through_a_method", "through_a_helper"])
def test_a_method_passing_its_own_object_on_whole_keys_what_it_holds(method):
    loss = _Loss()
    f = getattr(loss, method)
    g = tailjit.jit(f)

    def change():
        loss.cfg.k = 5.0
        loss.cfg.shifts[0] = 4

    _same_as_eager_after(f, change, jitted=g)
    keys = len(g.traces)
    loss.gain = 2.5  # a float setting stays an input: it keys no new trace
    torch.testing.assert_close(g(X), f(X))
    assert len(g.traces) == keys


@tailjit.op
def _scaled(x):
    (n,) = x.shape
    return tailjit.te.compute((n,), lambda i: x[i] * 3.0, name="y")


def test_a_tailjit_op_a_function_calls_is_no_captured_value():
    """tailjit's own objects are not the user's values (read at every call, an assignment to them refused):
    all of tailjit's code counts as a library's, not only the subpackage the captures module lives in (else a
    speculative trace calling a ``@tailjit.op`` is refused as assigning to it)."""

    def f(x):
        return _scaled(x) + 1

    assert [s.name for s in captures.sources(f)] == []
