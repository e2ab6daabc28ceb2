"""Runs that more than one integration module checks, trained once per session.

A module-scoped fixture is set up again for every module that asks for it, so
a run that two modules compare against (the same command line) was trained
twice. Such a run is a function `train(tmp_dir) -> result`, defined once in
the module it belongs to and imported by the others; `shared_run(train)`
trains it the first time any test asks and gives every later asker the same
result (a failure is kept too, and raised again, rather than run again).
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def shared_run(tmp_path_factory):
    done = {}

    def get(train):
        if train not in done:
            try:
                done[train] = (True, train(str(tmp_path_factory.mktemp(train.__name__))))
            except (Exception, pytest.fail.Exception, pytest.skip.Exception) as e:
                done[train] = (False, e)
        ok, value = done[train]
        if not ok:
            raise value
        return value

    return get
