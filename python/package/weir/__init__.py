"""Weir for Beam Python: run pipelines with ``--runner=weir.WeirRunner``.

The ``weir-beam`` wheel installs the ``weir`` binary (Weir's Beam Job API
server, ``weir serve``) next to the interpreter's other scripts, and this
module:

* :class:`WeirRunner`: Beam's PortableRunner that starts a local
  ``weir serve`` for each pipeline when no ``--job_endpoint`` is given, and
  stops it when the job is over; LOOPBACK environment by default.
* :class:`WeirOptions`: its pipeline options (``--weir_binary``,
  ``--weir_serve_args``).
* :class:`WeirJobServer`: one ``weir serve`` process as a Beam JobServer.
* :func:`find_binary`: which ``weir`` executable WeirRunner runs.

Example::

    python -m apache_beam.examples.wordcount --runner=weir.WeirRunner \\
        --input kinglear.txt --output counts
"""

from weir.runner import WeirOptions
from weir.runner import WeirRunner
from weir.server import WeirJobServer
from weir.server import find_binary


def _version():
  try:
    from importlib import metadata
    return metadata.version('weir-beam')
  except Exception:  # pylint: disable=broad-except
    return 'unknown'


#: The installed weir-beam version (the weir crate's version).
__version__ = _version()

__all__ = ['WeirJobServer', 'WeirOptions', 'WeirRunner', 'find_binary', '__version__']
