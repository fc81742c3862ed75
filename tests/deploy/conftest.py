"""Marks this pytest process's environment with a run id of its own, which every process the
deploy tests start inherits: flower_procs.of_this_worker tells this run's Flower processes from
those of another pytest run on the same machine (another session's worker of the same name)."""

import os
import uuid

os.environ.setdefault('PAXLIKE_TEST_RUN', os.environ.get('PYTEST_XDIST_TESTRUNUID')
                      or uuid.uuid4().hex)
