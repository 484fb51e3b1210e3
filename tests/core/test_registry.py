"""oblr.registry.Registry, and that every name-chosen thing of oblr is one of them."""

from __future__ import annotations

import pytest

from oblr.registry import Registry, UnknownNameError, option_parameters


def test_register_get_names_contains():
    reg = Registry("widget")

    @reg.register("b")
    def b():
        return "b"

    reg.register("a", 1)
    assert reg.get("b") is b and reg.get("a") == 1 and reg.names() == ["a", "b"] and list(reg) == ["a", "b"]
    assert "a" in reg and "c" not in reg and len(reg) == 2 and reg.items() == [("a", 1), ("b", b)]
    with pytest.raises(ValueError, match="widget 'a' is already registered"):
        reg.register("a", 2)
    with pytest.raises(UnknownNameError) as e:
        reg.get("c")
    assert str(e.value) == "unknown widget 'c'; registered: a, b"
    assert isinstance(e.value, KeyError) and isinstance(e.value, ValueError)
    assert reg.unregister("a") == 1 and reg.names() == ["b"]
    with pytest.raises(ValueError, match="non-empty string"):
        reg.register("")


def test_lazy_modules_are_imported_on_first_lookup():
    reg = Registry("thing", modules=("oblr.no_such_module_for_the_test",))
    assert reg.names() == []  # a missing module is skipped
    reg2 = Registry("thing", modules=("json",))
    assert "x" not in reg2


def test_every_choice_of_the_config_is_a_registry_or_a_table():
    from oblr.config import choice_fields

    keys = {key for key, _, _ in choice_fields()}
    assert keys == {"model.dtype", "task.name", "rollout.engine", "algorithm.baseline", "algorithm.lr_schedule",
                    "algorithm.aggregation", "algorithm.norms_method", "algorithm.checkpointed_engine",
                    "algorithm.memory_plan", "optim.optimizer",
                    "distributed.strategy"}
    for key, kind, names in choice_fields():
        assert names and kind, key


def test_option_parameters_evaluate_each_annotation_alone():
    """An annotation naming what its module imports only inside functions (``torch.Tensor`` in a module kept
    torch-free at import) stays text; the other options keep their evaluated types and ranges."""
    import typing

    from oblr.config import ConfigError, Range, check_options

    ns = {"Annotated": typing.Annotated, "Range": Range}
    exec("from __future__ import annotations\n"
         "def f(x: torch.Tensor, *, eps: Annotated[float, Range(gt=0)] = 1.0, n: int = 1): pass\n"
         "class C:\n"
         "    def __init__(self, m: nn.Module, *, eps: Annotated[float, Range(gt=0)] = 1.0): pass\n", ns)
    params = option_parameters(ns["f"], leading=1)
    assert typing.get_origin(params["eps"].annotation) is typing.Annotated
    assert params["n"].annotation is int
    assert option_parameters(ns["f"])["x"].annotation == "torch.Tensor"
    assert typing.get_origin(option_parameters(ns["C"], leading=1)["eps"].annotation) is typing.Annotated
    reg = Registry("thing", leading=1)
    reg.register("f", ns["f"])
    with pytest.raises(ConfigError, match=r"'opts.eps': must be > 0, got -1"):
        check_options(reg, "f", {"eps": -1}, "opts")
    with pytest.raises(ConfigError, match=r"'opts.n': expected int"):
        check_options(reg, "f", {"n": "two"}, "opts")
