"""A plugin whose import fails (a missing dependency)."""

import mrl_dependency_that_is_not_installed  # noqa: F401


def domains() -> list:
    return []
