"""The run record: one (grid point, method, seed) result of ``metrics.json``.

One typed, versioned type for what ``osfl run`` writes (built by
:func:`osfl.run_record.run_record`), what ``osfl.report`` reads back
(:func:`osfl.report.read_metrics` validates every record here, so a damaged
file is one :class:`RecordError` naming the field, never a traceback deep in a
table), and what the tables, ``osfl table`` and the suite's rows rank. The
schema, field by field, is ``docs/run-directory.md``.

This package sits below everything that uses records: it imports only
:mod:`osfl.errors`. ``fields.py``: what each field must be
(:func:`check_record`); ``types.py``: :class:`RunRecord` and
:class:`CurvePoint`; ``versions.py``: the file versions and :func:`migrate`.

osfl's own readers (tables, plots, scoreboard, audits, suite rows, trackers,
benchmarks) read a record's typed attributes (``record.bytes_up``,
``record.curve[i].global_test_accuracy``, ``record.provenance``), never its
string keys: ``tests/record/test_record.py`` runs them on a record whose item access
raises. :class:`RunRecord` is also a read-only ``Mapping`` of its JSON keys,
for export only: users' scripts that read ``record["bytes_up"]``, and
:meth:`RunRecord.to_dict`, which writes exactly the keys the record was built
with (and in that order), so ``metrics.json`` keeps its shape. Keys that only
some methods or runs write (``server``, ``audit``, ``site_accuracies``, ...)
are kept as written in ``extras``.

One name per number: the unprefixed accuracy keys (``global_test_accuracy``,
``per_class_accuracy``, ``validation_accuracy``, ``local_test_accuracy``) are
the server predictor's, everywhere a run writes them (round events, curve,
record, tables, trackers); the clients' own models' are named for them
(``mean_client_accuracy``, ``client_accuracies``,
``mean_client_per_class_accuracy``, ``mean_client_validation_accuracy``,
``mean_client_local_test_accuracy``, ``client_local_test_accuracies``).

Versions (the document's ``schema_version``):

1. ``global_test_accuracy`` of a method whose clients keep their own models
   (``local``, EFTViT's ``OwnModels``) was the clients' mean.
2. ``global_test_accuracy`` is always the server predictor's accuracy (``None``
   where there is none, e.g. ``local``); the clients' mean is only
   ``mean_client_accuracy``. The runtime still wrote the clients' numbers
   under the server's names (round events, ``curve``, ``convergence``,
   ``per_class_accuracy``, ``validation_accuracy``, ``local_test_accuracy``)
   and the server's as ``server_*``.
3. The same from the runtime on: the server predictor's numbers under the
   unprefixed names (``server_accuracy`` and ``server_*`` are gone), the
   clients' under the names above; a ``curve`` point names its accuracies as
   the record does (``global_test_accuracy``, ``mean_client_accuracy``, ...,
   no ``accuracy``), ``convergence.accuracy_key`` says which of them it
   measured, and ``best_on_validation`` names its two accuracies the same way.

:func:`migrate` reads a version-1 or -2 record into version 3. The one
intended change of version 3 to what a run computes: EFTViT's round events,
curve, convergence and trackers now carry the server predictor's accuracy as
``global_test_accuracy`` (before, the clients' mean), as its final record
already did; the clients' mean is ``mean_client_accuracy`` in all of them.
"""

from __future__ import annotations

from osfl.record.fields import (
    RECORD_FIELDS,
    REQUIRED_FIELDS,
    RecordError,
    check_record,
    plain,
    record_problem,
)
from osfl.record.types import CurvePoint, RunRecord, typed
from osfl.record.versions import (
    READABLE_VERSIONS,
    SCHEMA_VERSION,
    V2_CLIENT_KEYS,
    V2_SERVER_KEYS,
    as_json,
    file_version,
    migrate,
    read_records,
)

__all__ = [
    "READABLE_VERSIONS",
    "RECORD_FIELDS",
    "REQUIRED_FIELDS",
    "SCHEMA_VERSION",
    "V2_CLIENT_KEYS",
    "V2_SERVER_KEYS",
    "CurvePoint",
    "RecordError",
    "RunRecord",
    "as_json",
    "check_record",
    "file_version",
    "migrate",
    "plain",
    "read_records",
    "record_problem",
    "typed",
]
