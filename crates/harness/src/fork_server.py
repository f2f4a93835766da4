"""Weir's Python fork server: one interpreter that has imported the SDK
harness's modules and forks a fresh SDK harness process for each request.

Run by the Weir server as `python fork_server.py SOCKET MODULE`, MODULE being
the harness's main module (apache_beam.runners.worker.sdk_worker_main): it is
imported once here, and each fork runs it as `python -m MODULE` would (the
forks keep this command line, so `ps` names the module). Protocol on the Unix
socket SOCKET, one request per connection (sent by `weir boot`):
  request: one JSON line {"argv": [...], "env": {...}, "cwd": "..."} with the
           caller's stdin, stdout and stderr attached (SCM_RIGHTS);
  replies: "pid N\\n" once the harness is forked, "exit CODE\\n" when it ends
           (CODE as os.waitstatus_to_exitcode: negative for a signal).
The caller closing its connection kills the harness. End of standard input
(the Weir server went away) kills every harness and ends the fork server.
No job's code runs in this process: each harness is forked before it reads
its options or the job's main session.
"""
import gc
import json
import os
import selectors
import signal
import socket
import sys

PR_SET_PDEATHSIG = 1


def die_with_parent():
  """The harness ends when the fork server does (prctl PR_SET_PDEATHSIG)."""
  try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
  except Exception:  # pylint: disable=broad-except
    pass


def become_harness(module, request, fds, inherited):
  """In the forked child: closes the fork server's descriptors (`inherited`),
  takes the caller's standard streams, environment and folder, then runs the
  SDK harness as `python -m` would. Never returns."""
  code = 1
  try:
    die_with_parent()
    for fd in inherited:
      try:
        os.close(fd)
      except OSError:
        pass
    for target, fd in enumerate(fds):
      os.dup2(fd, target)
      os.close(fd)
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD):
      signal.signal(s, signal.default_int_handler if s == signal.SIGINT else signal.SIG_DFL)
    os.chdir(request['cwd'])
    os.environ.clear()
    os.environ.update(request['env'])
    # State that importing set from the fork server's environment, or seeded,
    # would otherwise be the same in every fork (`random` reseeds itself).
    interceptor = sys.modules.get('apache_beam.runners.worker.worker_id_interceptor')
    if interceptor is not None:
      interceptor.WorkerIdInterceptor._worker_id = os.environ.get('WORKER_ID')  # pylint: disable=protected-access
    np_random = sys.modules.get('numpy.random')
    if np_random is not None:
      np_random.seed()
    sys.path[0] = os.getcwd()
    sys.argv = ['-m'] + list(request['argv'])
    # `python -m` runs the module as a fresh __main__ only: the imported
    # copy goes, and this script's namespace is not the harness's.
    sys.modules.pop(module, None)
    import types
    sys.modules['__main__'] = types.ModuleType('__main__')
    import runpy
    try:
      runpy._run_module_as_main(module, alter_argv=True)  # pylint: disable=protected-access
      code = 0
    except SystemExit as e:
      code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
      if not isinstance(e.code, int) and e.code is not None:
        print(e.code, file=sys.stderr)
    except BaseException:  # pylint: disable=broad-except
      sys.excepthook(*sys.exc_info())
      code = 1
    # What interpreter shutdown does before exiting.
    import threading
    try:
      threading._shutdown()  # pylint: disable=protected-access
    except Exception:  # pylint: disable=broad-except
      pass
    import atexit
    atexit._run_exitfuncs()  # pylint: disable=protected-access
  finally:
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except Exception:  # pylint: disable=broad-except
        pass
    os._exit(code)


def read_request(conn):
  """The request line and the three descriptors sent with it."""
  data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
  while not data.endswith(b'\n'):
    more = conn.recv(1 << 16)
    if not more:
      break
    data += more
  if len(fds) != 3:
    for fd in fds:
      os.close(fd)
    raise ValueError('expected 3 file descriptors, got %d' % len(fds))
  return json.loads(data), fds


def main(path, module):
  # What `python -m MODULE` imports: the cost each harness would pay.
  import importlib
  importlib.import_module(module)
  # What is here now stays: the forks' garbage collections skip it (and so
  # do not copy its pages).
  gc.freeze()
  listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  listener.bind(path + '.tmp')
  os.rename(path + '.tmp', path)
  listener.listen(64)
  sel = selectors.DefaultSelector()
  sel.register(listener, selectors.EVENT_READ, ('accept', None))
  sel.register(sys.stdin, selectors.EVENT_READ, ('parent', None))
  harnesses = {}  # pid -> (conn, pidfd)

  def finish(pid, kill):
    conn, pidfd = harnesses.pop(pid)
    if kill:
      try:
        os.kill(pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
    _, status = os.waitpid(pid, 0)
    sel.unregister(pidfd)
    os.close(pidfd)
    sel.unregister(conn)
    try:
      conn.sendall(b'exit %d\n' % os.waitstatus_to_exitcode(status))
    except OSError:
      pass
    conn.close()

  while True:
    for key, _ in sel.select():
      what, pid = key.data
      if what == 'parent':
        if not os.read(sys.stdin.fileno(), 4096):
          for p in list(harnesses):
            finish(p, kill=True)
          return
      elif what == 'accept':
        conn, _ = listener.accept()
        try:
          request, fds = read_request(conn)
        except Exception as e:  # pylint: disable=broad-except
          try:
            conn.sendall(b'error %s\n' % str(e).encode())
          except OSError:
            pass
          conn.close()
          continue
        child = os.fork()
        if child == 0:
          inherited = [listener.fileno(), conn.fileno(), sel.fileno()]
          for c, p in harnesses.values():
            inherited += [c.fileno(), p]
          become_harness(module, request, fds, inherited)
        for fd in fds:
          os.close(fd)
        pidfd = os.pidfd_open(child)
        harnesses[child] = (conn, pidfd)
        sel.register(conn, selectors.EVENT_READ, ('caller', child))
        sel.register(pidfd, selectors.EVENT_READ, ('exited', child))
        try:
          conn.sendall(b'pid %d\n' % child)
        except OSError:
          pass
      elif what == 'caller':
        # The caller (`weir boot`) sends nothing more: readable means gone.
        if pid in harnesses and not key.fileobj.recv(1):
          finish(pid, kill=True)
      elif what == 'exited':
        if pid in harnesses:
          finish(pid, kill=False)


if __name__ == '__main__':
  main(sys.argv[1], sys.argv[2])
