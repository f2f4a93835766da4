"""Sends Weir's Job API token from a Beam Python pipeline.

Beam's Python PortableRunner opens its Job API and artifact staging
channels with a bare ``grpc.insecure_channel(endpoint)``: it has no option
for call credentials or metadata. This module adds the metadata
``authorization: Bearer <token>`` (what ``weir serve --auth_token`` checks)
to every gRPC channel the process opens with ``grpc.insecure_channel``.

Use it either way:

    # run a pipeline script (like `python my_pipeline.py ARGS`)
    WEIR_AUTH_TOKEN=... python -m weir_auth my_pipeline.py --runner=PortableRunner ...
    # or a module (like `python -m apache_beam.examples.wordcount ARGS`)
    WEIR_AUTH_TOKEN=... python -m weir_auth -m apache_beam.examples.wordcount ...

    # or from code, before the pipeline runs
    import weir_auth; weir_auth.install()          # reads $WEIR_AUTH_TOKEN
    weir_auth.install(token='...')

(put Weir's ``python/`` folder on ``PYTHONPATH``, or copy this file). The
token then also rides on the channels of a LOOPBACK SDK harness to Weir's
Fn API, which ignores it. The token is sent in clear text: over a network
that is not trusted, use it only through a TLS tunnel.
"""

import os
import runpy
import sys

import grpc

ENV = 'WEIR_AUTH_TOKEN'

_installed = None


class _AddToken(grpc.UnaryUnaryClientInterceptor,
                grpc.UnaryStreamClientInterceptor,
                grpc.StreamUnaryClientInterceptor,
                grpc.StreamStreamClientInterceptor):
  def __init__(self, token):
    self._header = ('authorization', 'Bearer ' + token)

  def _details(self, details):
    metadata = list(details.metadata or []) + [self._header]
    return details._replace(metadata=metadata) if hasattr(
        details, '_replace') else _Details(details, metadata)

  def intercept_unary_unary(self, continuation, details, request):
    return continuation(self._details(details), request)

  def intercept_unary_stream(self, continuation, details, request):
    return continuation(self._details(details), request)

  def intercept_stream_unary(self, continuation, details, requests):
    return continuation(self._details(details), requests)

  def intercept_stream_stream(self, continuation, details, requests):
    return continuation(self._details(details), requests)


class _Details(grpc.ClientCallDetails):
  def __init__(self, d, metadata):
    self.method = d.method
    self.timeout = d.timeout
    self.metadata = metadata
    self.credentials = d.credentials
    self.wait_for_ready = getattr(d, 'wait_for_ready', None)
    self.compression = getattr(d, 'compression', None)


def install(token=None):
  """Adds the token (default: $WEIR_AUTH_TOKEN) to every channel opened
  from now on with grpc.insecure_channel. Returns False when there is no
  token (nothing changes)."""
  global _installed
  token = (token if token is not None else os.environ.get(ENV, '')).strip()
  if not token:
    return False
  if _installed is None:
    plain = grpc.insecure_channel

    def insecure_channel(target, options=None, compression=None):
      channel = plain(target, options=options, compression=compression)
      return grpc.intercept_channel(channel, _installed)

    grpc.insecure_channel = insecure_channel
  _installed = _AddToken(token)
  return True


def main(argv):
  if not argv:
    sys.exit('usage: python -m weir_auth SCRIPT ARGS... | -m MODULE ARGS...')
  if not install():
    sys.exit('weir_auth: set %s to the Job API token' % ENV)
  if argv[0] == '-m' and len(argv) > 1:
    sys.argv = [argv[1]] + argv[2:]
    runpy.run_module(argv[1], run_name='__main__', alter_sys=True)
  else:
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
    runpy.run_path(argv[0], run_name='__main__')


if __name__ == '__main__':
  main(sys.argv[1:])
