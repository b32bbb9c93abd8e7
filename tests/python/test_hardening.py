# SPDX-License-Identifier: Apache-2.0
"""Python must never crash the interpreter (issue 18 §3): pickling with every protocol, instances made by __new__
alone, I/O errors as OSError subclasses, paths with a NUL byte, optimize on data without rows, and contexts of
different widths across rows. The exception translation across extension modules is checked in test_stream.py
(it needs attnmix._stream)."""
import copy
import errno
import os
import pickle
import pickletools
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import attnmix
from attnmix import _core
from helpers import random_model

VEA = "variational_embedding_attention"
NOT_INITIALISED = "object is not initialised \\(created by __new__ without __init__\\)"


# ---- one valid instance of every class that pickles -------------------------------------------------------------


def _vea(rng):
    S, D, T, N = 4, 2, 3, 3
    return attnmix.VariationalEmbeddingAttentionDistribution(
        rng.standard_normal((S, D)), np.full((S, D), -1.0), rng.dirichlet(np.ones(T), size=S),
        rng.dirichlet(np.ones(N)), sigma2=0.5, name="vea")


def _vmha(rng):
    S, D, T = 4, 2, 3
    return attnmix.VariationalMultiHopAttentionDistribution(
        rng.standard_normal((S, D)), np.full((S, D), -1.0), rng.dirichlet(np.ones(T), size=S), sigma2=0.3)


def _ca(rng):
    L, S, T = 2, 4, 3
    return attnmix.ChainedAttentionDistribution(rng.standard_normal((L, S, S)), rng.dirichlet(np.ones(T), size=S),
                                                sigma2=0.3, name="ca")


def _sparse(rng):
    keys = {"shape": (3, 3), "row_begin": [0, 1, 2, 3], "columns": [0, 1, 2], "values": rng.standard_normal(3)}
    emission = {"shape": (3, 2), "row_begin": [0, 1, 1, 2], "columns": [0, 1], "values": [0.7, 0.4],
                "default": [0.3, 0.5, 0.6]}
    return attnmix.SparseResponsibilityAttentionDistribution(keys, emission, [0.25, 0.75], sigma2=0.4, name="sparse")


PICKLEABLE = {
    "ResponsibilityAttentionDistribution": lambda rng: random_model(rng, name="ra"),
    "ChainedAttentionDistribution": _ca,
    "SparseResponsibilityAttentionDistribution": _sparse,
    "VariationalEmbeddingAttentionDistribution": _vea,
    "VariationalMultiHopAttentionDistribution": _vmha,
    "MixtureDistribution": lambda rng: attnmix.MixtureDistribution([random_model(rng), _vea(rng)], [0.25, 0.75]),
    "CompositeDistribution": lambda rng: attnmix.CompositeDistribution(
        [attnmix.CategoricalDistribution([0.5, 0.5]), attnmix.DiagonalGaussianDistribution([0.0], [2.0])],
        name="pair"),
    "CategoricalDistribution": lambda rng: attnmix.CategoricalDistribution([0.2, 0.8], name="c"),
    "DiagonalGaussianDistribution": lambda rng: attnmix.DiagonalGaussianDistribution([0.0, 1.0], [1.0, 2.0]),
    "AttentionOptimizerState": lambda rng: attnmix.AttentionOptimizerState.fresh(
        VEA, rng.standard_normal((2, 2)), rng.standard_normal((2, 2)), seed=4),
}


def _classes(module):
    """Every class of module and of its submodules (attnmix._core.assign), by name."""
    out = {}
    for name in dir(module):
        value = getattr(module, name)
        if isinstance(value, type):
            out[name] = value
        elif type(value) is type(module) and value.__name__.startswith(module.__name__ + "."):
            out.update({f"{value.__name__.rsplit('.', 1)[1]}.{k}": v for k, v in _classes(value).items()})
    return out


def _same(a, b):
    """Equality of pickle states: nested tuples / lists / dicts of numpy arrays and scalars."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return np.array_equal(np.asarray(a), np.asarray(b))
    if isinstance(a, (tuple, list)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if hasattr(a, "__getstate__") and type(a).__module__.startswith("attnmix"):
        return type(a) is type(b) and _same(a.__getstate__(), b.__getstate__())
    return a == b


def test_every_class_that_pickles_is_covered():
    """A new pickling class must be added to PICKLEABLE, so that every protocol is tested for it."""
    pickling = {name for name, cls in _classes(_core).items()
                if hasattr(cls, "__setstate__") and not issubclass(cls, BaseException)}
    assert pickling == set(PICKLEABLE)


@pytest.mark.parametrize("name", sorted(PICKLEABLE))
@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
def test_pickles_with_every_protocol(name, protocol, rng):
    obj = PICKLEABLE[name](rng)
    data = pickle.dumps(obj, protocol=protocol)
    again = pickle.loads(data)
    assert type(again) is type(obj)
    assert _same(again.__getstate__(), obj.__getstate__())
    if protocol >= 2:  # the pickle of protocols 2-5 is the one they always wrote: NEWOBJ, then BUILD
        ops = {op.name for op, _, _ in pickletools.genops(data)}
        assert {"NEWOBJ", "BUILD"} <= ops


@pytest.mark.parametrize("name", sorted(PICKLEABLE))
def test_reduce_copy_and_deepcopy(name, rng):
    obj = PICKLEABLE[name](rng)
    func, args, state = obj.__reduce__()
    assert func is copyreg_newobj() and args == (type(obj),)
    assert _same(state, obj.__getstate__())
    for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
        assert obj.__reduce_ex__(protocol)[0] is func
    for again in (copy.copy(obj), copy.deepcopy(obj)):
        assert type(again) is type(obj) and _same(again.__getstate__(), obj.__getstate__())


def copyreg_newobj():
    import copyreg

    return copyreg.__newobj__


def test_models_still_work_after_a_protocol_0_round_trip(rng):
    model = random_model(rng)
    again = pickle.loads(pickle.dumps(model, protocol=0))
    data = model.sampler(3).sample(20)
    np.testing.assert_array_equal(again.seq_log_density(data), model.seq_log_density(data))


@pytest.mark.parametrize("name", sorted(set(PICKLEABLE) - {"AttentionOptimizerState"}))
def test_pickle_states_of_the_wrong_length_are_value_errors(name, rng):
    state = PICKLEABLE[name](rng).__getstate__()
    cls = type(PICKLEABLE[name](rng))
    for wrong in (state + (None,), state[:-2] if name.startswith(("Responsibility", "VariationalEmbedding"))
                  else state[:-1]):
        obj = cls.__new__(cls)
        with pytest.raises(ValueError, match=f"^{name}: bad pickle state$"):
            obj.__setstate__(wrong)


@pytest.mark.parametrize("name", ["ResponsibilityAttentionDistribution", "VariationalEmbeddingAttentionDistribution"])
def test_pickles_from_before_precision_load_as_float64(name, rng):
    """The state gained precision last; a state without it, as older versions wrote, gives a float64 model."""
    model = PICKLEABLE[name](rng)
    state = model.__getstate__()
    assert state[-1] == "float64"
    obj = type(model).__new__(type(model))
    obj.__setstate__(state[:-1])
    assert obj.precision == "float64" and _same(obj.__getstate__(), state)
    mixed = type(model).__new__(type(model))
    mixed.__setstate__(state[:-1] + ("mixed",))
    assert mixed.precision == "mixed" and repr(mixed).endswith("precision='mixed')")


def test_classes_that_do_not_pickle_refuse_with_type_error_for_every_protocol(rng):
    objects = [attnmix.Rng(3), random_model(rng).dist_to_encoder(),
               random_model(rng).dist_to_encoder().seq_encode(random_model(rng).sampler(1).sample(3))]
    for obj in objects:
        name = type(obj).__name__
        for protocol in range(pickle.HIGHEST_PROTOCOL + 1):
            with pytest.raises(TypeError, match=f"cannot pickle '{name}' object"):
                pickle.dumps(obj, protocol=protocol)
        with pytest.raises(TypeError, match=f"cannot pickle '{name}' object"):
            obj.__reduce__()
    assert copy.copy(objects[0]).next_u64() == attnmix.Rng(3).next_u64()  # Rng copies through __copy__


# ---- instances made by __new__ alone ----------------------------------------------------------------------------

# Run in a child process: a crash there fails the test instead of killing pytest. For every class of _core (and of
# _stream when it is built): make an instance with __new__ alone (unless __new__ refuses), then poke repr, str,
# pickle, save_model and every public attribute (properties are read; methods called with 0-3 None arguments and
# with the instance itself as the argument), and pass the instance to every module function. Any Python exception
# is fine except SystemError (an escaped C++ exception); for each class at least the pickle and a direct C++ call
# must raise the TypeError that names the class.
_POKE = textwrap.dedent(
    r"""
    import importlib, os, pickle, re, sys, tempfile
    import attnmix
    from attnmix import _core

    modules = [_core]
    try:
        modules.append(importlib.import_module("attnmix._stream"))
    except ImportError:
        pass

    def classes(module):
        for name in dir(module):
            value = getattr(module, name)
            if isinstance(value, type):
                yield value
            elif type(value) is type(module) and value.__name__.startswith(module.__name__ + "."):
                yield from classes(value)

    def functions(module):
        for name in dir(module):
            value = getattr(module, name)
            if callable(value) and not isinstance(value, type) and not name.startswith("_"):
                yield name, value
            elif type(value) is type(module) and value.__name__.startswith(module.__name__ + "."):
                yield from functions(value)

    bad = []
    checked = 0
    tmp = tempfile.mkdtemp()

    def poke(what, call):
        try:
            call()
        except SystemError as e:
            bad.append(f"{what}: SystemError {e}")
        except Exception:
            pass

    for module in modules:
        for cls in classes(module):
            if issubclass(cls, BaseException):
                continue
            try:
                obj = cls.__new__(cls)
            except TypeError:
                continue
            name = cls.__name__
            sys.stderr.write(f"poking {module.__name__}.{name}\n")
            sys.stderr.flush()
            checked += 1
            for what, call in [("repr", lambda: repr(obj)), ("str", lambda: str(obj)),
                               ("hash", lambda: hash(obj)), ("eq", lambda: obj == obj),
                               ("save_model", lambda: attnmix.save_model(obj, os.path.join(tmp, "m.json")))]:
                poke(f"{name} {what}", call)
            try:
                pickle.dumps(obj, protocol=2)
                bad.append(f"{name}: pickled")
            except TypeError as e:
                if name not in str(e):
                    bad.append(f"{name}: pickle raised {e!r}")
            for attr in sorted(set(dir(cls))):
                if attr.startswith("__") and attr not in ("__getstate__", "__len__", "__iter__", "__getitem__",
                                                          "__call__", "__copy__", "__deepcopy__", "__setstate__"):
                    continue
                static = isinstance(cls.__dict__.get(attr), (staticmethod, classmethod))
                if static:
                    continue
                try:
                    value = getattr(obj, attr)
                except SystemError as e:
                    bad.append(f"{name}.{attr}: SystemError {e}")
                    continue
                except Exception:
                    continue
                if callable(value):
                    for args in [(), (None,), (None, None), (None, None, None), (obj,), (obj, obj)]:
                        poke(f"{name}.{attr} with {len(args)} arguments", lambda: value(*args))
            for fname, function in functions(module):
                if fname in ("save_model", "load_model"):
                    continue
                for args in [(obj,), (obj, obj), ([obj],), ([obj], [1.0])]:
                    poke(f"{fname}({name})", lambda: function(*args))
    print(f"checked {checked} classes")
    if bad:
        print("\n".join(bad))
        sys.exit(1)
    """
)


def test_instances_made_by_new_alone_never_crash():
    result = subprocess.run([sys.executable, "-c", _POKE], capture_output=True, text=True, timeout=600)
    last = result.stderr.strip().splitlines()[-1:] if result.stderr else []
    assert result.returncode == 0, f"exit {result.returncode} after {last}\n{result.stdout}\n{result.stderr[-3000:]}"
    assert int(result.stdout.split("checked ")[1].split()[0]) >= 30


def test_new_alone_gives_a_type_error_naming_the_class(tmp_path):
    cls = attnmix.ResponsibilityAttentionDistribution
    obj = cls.__new__(cls)
    message = "^ResponsibilityAttentionDistribution " + NOT_INITIALISED + "$"
    with pytest.raises(TypeError, match=message):
        repr(obj)
    with pytest.raises(TypeError, match=message):
        obj.sigma2  # noqa: B018
    base = "^Distribution " + NOT_INITIALISED + "$"  # where the C++ code needs the base class, the error names it
    with pytest.raises(TypeError, match=base):
        obj.log_density((np.array([0, 1, 2, 3]), np.zeros(3), 1))
    with pytest.raises(TypeError, match=base):
        attnmix.save_model(obj, tmp_path / "m.json")
    assert not (tmp_path / "m.json").exists()
    with pytest.raises(TypeError, match=message):
        pickle.dumps(obj, protocol=0)
    with pytest.raises(TypeError, match=base):
        attnmix.MixtureDistribution([obj], [1.0])
    rng = attnmix.Rng.__new__(attnmix.Rng)
    with pytest.raises(TypeError, match="^Rng " + NOT_INITIALISED + "$"):
        rng.next_u64()
    with pytest.raises(TypeError, match="^Rng " + NOT_INITIALISED + "$"):
        random_model(np.random.default_rng(1)).sampler(rng)
    # __setstate__ (what unpickling calls) and __init__ still make the instance whole.
    model = random_model(np.random.default_rng(2))
    obj.__setstate__(model.__getstate__())
    assert obj.sigma2 == model.sigma2
    rng.__init__(5)
    assert rng.next_u64() == attnmix.Rng(5).next_u64()


# ---- I/O errors are OSError subclasses; paths with a NUL byte are ValueError ---------------------------------------


@pytest.mark.parametrize(
    "error_number, expected",
    [(errno.ENOENT, FileNotFoundError), (errno.EACCES, PermissionError), (errno.EISDIR, IsADirectoryError),
     (errno.ENOSPC, OSError), (0, OSError)],
)
def test_io_errors_translate_to_os_error_by_errno(error_number, expected):
    with pytest.raises(OSError) as info:
        _core._raise("IoError", "where.json: cannot open the model file: reason", error_number=error_number)
    assert type(info.value) is expected
    assert info.value.errno == (error_number or None)
    assert "where.json: cannot open the model file: reason" in str(info.value)


def test_model_file_io_errors_are_os_errors(tmp_path, rng):
    missing = tmp_path / "missing.json"
    with pytest.raises(FileNotFoundError, match="missing.json: cannot open the model file") as info:
        attnmix.load_model(missing)
    assert info.value.errno == errno.ENOENT
    with pytest.raises(IsADirectoryError, match=str(tmp_path)):
        attnmix.load_model(tmp_path)
    model = random_model(rng)
    with pytest.raises(FileNotFoundError, match="no_such_dir"):
        attnmix.save_model(model, tmp_path / "no_such_dir" / "m.json")
    with pytest.raises(IsADirectoryError):
        attnmix.save_model(model, tmp_path)
    assert sorted(os.listdir(tmp_path)) == []  # nothing left behind
    if os.geteuid() != 0:  # root reads and writes everything
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(PermissionError):
            attnmix.save_model(model, locked / "m.json")


def test_paths_with_a_nul_byte_are_value_errors(tmp_path, rng):
    model = random_model(rng)
    good = tmp_path / "m.json"
    attnmix.save_model(model, good)
    with pytest.raises(ValueError, match="contains a NUL byte"):
        attnmix.load_model(str(good) + "\0junk")  # used to load m.json
    with pytest.raises(ValueError, match="contains a NUL byte"):
        attnmix.save_model(model, str(tmp_path / "n.json") + "\0junk")
    assert sorted(os.listdir(tmp_path)) == ["m.json"]  # used to write n.json


# ---- optimize on data without rows ----------------------------------------------------------------------------


def test_optimize_on_data_without_rows_raises(rng):
    est = attnmix.ResponsibilityAttentionEstimator(5, 4, 3, 6, sigma2=0.7)
    empty = (np.zeros((0, 4), dtype=np.int64), np.zeros((0, 3)), np.zeros(0, dtype=np.int64))
    for data in ([], empty, est.accumulator_factory().make().acc_to_encoder().seq_encode(empty)):
        for reuse in (True, False):
            with pytest.raises(ValueError, match="^optimize: the data has no rows"):
                attnmix.optimize(data, est, out=None, reuse_estep_ll=reuse)
        with pytest.raises(ValueError, match="^optimize: the data has no rows"):
            attnmix.optimize(data, est, out=None, prev_estimate=random_model(rng), max_its=0)
    mixture = attnmix.MixtureEstimator([est, est])
    with pytest.raises(ValueError, match="^optimize: the data has no rows"):
        attnmix.optimize([], mixture, out=None)
    # One row still fits.
    fitted = attnmix.optimize(random_model(rng).sampler(1).sample(1), est, out=None, max_its=2)
    assert isinstance(fitted, attnmix.ResponsibilityAttentionDistribution)


# ---- contexts of different widths across rows: a shape problem (ValueError) --------------------------------------


def test_contexts_of_different_widths_are_value_errors(rng):
    ra = random_model(rng).dist_to_encoder()
    with pytest.raises(ValueError, match="contexts must all have the same length \\(row 0 has 2, row 1 has 1\\)"):
        ra.seq_encode([([0, 1], [0.0, 0.0, 0.0], 1), ([0], [0.0, 0.0, 0.0], 1)])
    ca = _ca(rng).dist_to_encoder()
    with pytest.raises(ValueError, match="keys must all have the same length \\(row 0 has 2, row 2 has 3\\)"):
        ca.seq_encode([([0, 1], [1, 2], 0, 1), ([0, 1], [1, 2], 0, 1), ([0, 1, 2], [1, 2, 3], 0, 1)])
    vea = attnmix.VariationalEmbeddingAttentionEstimator(4, 3, 2, 3).accumulator_factory().make().acc_to_encoder()
    with pytest.raises(ValueError, match="contexts must all have the same length \\(row 0 has 3, row 1 has 2\\)"):
        vea.seq_encode([([0, 1, 2], 1, 2), ([0, 1], 1, 2)])
    # The validation rules' TypeErrors (docs/mechanisms.md#building-blocks) stay: a ragged nesting inside one field,
    # bool ids, a wrong arity.
    with pytest.raises(TypeError):
        ra.seq_encode([([[0, 1], [2]], [0.0, 0.0, 0.0], 1)])
    with pytest.raises(TypeError, match="bool"):
        ra.seq_encode([([True, 1, 2, 3], [0.0, 0.0, 0.0], 1)])
    with pytest.raises(TypeError, match="^attention observations must be context/query/target triples$"):
        ra.seq_encode([([0, 1, 2, 3], [0.0, 0.0, 0.0])])
