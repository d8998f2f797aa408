import pathlib

import pytest

TOP = pathlib.Path(__file__).resolve().parents[2]
CONF = TOP / "conf"
RECIPES = [CONF / "recipe.ini"] + sorted((CONF / "examples").glob("*.ini"))


def pytest_collection_modifyitems(config, items):
    # a test that needs a CUDA device is skipped on a machine without one
    import hq
    if hq.device_count() == 0:
        skip = pytest.mark.skip(reason="no CUDA device")
        for item in items:
            if "cuda" in item.keywords:
                item.add_marker(skip)


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA device")
