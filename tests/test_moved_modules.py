"""The modules that moved keep their old names for a release, with a deprecation warning."""

import importlib
import sys

import pytest

import fedjax_het
from fedjax_het import _moved
from fedjax_het.engine import cohort


def test_an_old_module_path_imports_the_moved_module_with_a_warning():
    sys.modules.pop("fedjax_het.cohort", None)
    with pytest.warns(DeprecationWarning, match="fedjax_het.cohort moved to fedjax_het.engine.cohort"):
        old = importlib.import_module("fedjax_het.cohort")
    assert old is cohort
    sys.modules.pop("fedjax_het.cohort", None)


def test_an_old_attribute_of_the_package_is_the_moved_module():
    with pytest.warns(DeprecationWarning, match="moved to fedjax_het.transforms.compression"):
        old = fedjax_het.compression
    assert old is importlib.import_module("fedjax_het.transforms.compression")


@pytest.mark.parametrize("old", sorted(_moved.MOVED))
def test_every_moved_name_has_a_module_at_its_new_place(old):
    importlib.import_module(f"fedjax_het.{_moved.MOVED[old]}")


def test_names_that_never_existed_still_fail():
    with pytest.raises(AttributeError, match="no attribute 'nonesuch'"):
        fedjax_het.nonesuch
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("fedjax_het.nonesuch")
