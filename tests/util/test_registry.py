"""A registry remembers who registered each name (rayfed.util.registry): a registration made outside rayfed is a
plugin registration, which travels to a run's other processes and is installed there by ``adopt``."""

from __future__ import annotations

import pytest

from rayfed.util.errors import ConfigError
from rayfed.util.registry import Registry


def test_a_registration_remembers_its_origin_and_one_of_a_name_by_another_module_is_refused_naming_both() -> None:
    sizes: Registry[int] = Registry("test size", field="test.size")
    sizes.register("small")(4)
    assert sizes.origin("small") == __name__
    with pytest.raises(ValueError, match=f"registered twice \\(by {__name__} and other_module\\)"):
        sizes.register("small", origin="other_module")(5)


def test_the_same_module_registering_a_name_again_replaces_its_own_registration() -> None:
    """A script or notebook cell run twice in one process registers its method twice: the second one wins."""
    sizes: Registry[int] = Registry("test rerun size", field="test.size")
    sizes.register("small")(4)
    sizes.register("small")(5)
    assert (sizes.get("small"), sizes.origin("small")) == (5, __name__)


def test_adopt_installs_a_sent_registration_but_never_replaces_one_of_rayfeds() -> None:
    sizes: Registry[int] = Registry("test adopted size", field="test.size")
    sizes.register("builtin", origin="rayfed.models.cnn")(1)
    sizes.adopt("builtin", 2, "user_module")
    sizes.adopt("mine", 3, "user_module")
    sizes.adopt("mine", 4, "user_module")  # a later run's registration of the name replaces it
    assert (sizes.get("builtin"), sizes.get("mine"), sizes.origin("mine")) == (1, 4, "user_module")


def test_an_unknown_name_says_how_a_users_own_registration_is_found() -> None:
    sizes: Registry[int] = Registry("test unknown size", field="test.size")
    with pytest.raises(ConfigError, match="lists that module in plugins"):
        sizes.get("nope")


def test_shipped_lists_what_rayfeds_own_modules_registered() -> None:
    sizes: Registry[int] = Registry("test shipped size", field="test.size")
    sizes.register("builtin", origin="rayfed.models.cnn")(1)
    sizes.register("mine", origin="user_module")(2)
    assert (sizes.names(), sizes.shipped()) == (["builtin", "mine"], ["builtin"])
