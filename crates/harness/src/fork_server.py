"""Weir's Python fork server: one interpreter that has imported the SDK
harness's modules and forks a fresh SDK harness process for each request.

Run by the Weir server as `python fork_server.py SOCKET MODULE`, MODULE being
the harness's main module (apache_beam.runners.worker.sdk_worker_main): it is
imported once here, and each fork runs it as `python -m MODULE` would (the
forks keep this command line, so `ps` names the module).

Protocol on the Unix socket SOCKET, one request per connection (sent by
`weir boot`):
  request: one JSON line {"argv": [...], "env": {...}, "cwd": "...",
           "cpus": [...] or null} with the caller's stdin, stdout and stderr
           attached (SCM_RIGHTS); the harness runs on those CPUs only, the
           caller's own (the Weir server may pin it to a core);
  replies: "pid N\\n" once the harness is forked, then "exit CODE\\n" when it
           ends (CODE as os.waitstatus_to_exitcode: negative for a signal);
           or "error WHY\\n" when no harness was forked (the request was
           malformed, or the imported files changed on disk: then the fork
           server exits with 75 once its harnesses have ended).
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
import traceback

PR_SET_PDEATHSIG = 1
# How long a caller may take to send its request.
REQUEST_TIMEOUT_S = 5.0
# Exit code once the imported files changed on disk (an upgrade of Beam)
# and no harness runs: the Weir server starts a new fork server.
STALE = 75


def stamp(module):
  """What identifies the imported code on disk: the module's file and its
  top package's, by inode, size and modification time."""
  top = sys.modules[module.split('.')[0]]
  out = []
  for f in (sys.modules[module].__file__, top.__file__):
    st = os.stat(f)
    out.append((f, st.st_ino, st.st_size, st.st_mtime_ns))
  return out


def reseed(module):
  """State that importing Beam set in this process, per process by intent,
  made fresh for one fork (`random` reseeds itself at fork)."""
  interceptor = sys.modules.get('apache_beam.runners.worker.worker_id_interceptor')
  if interceptor is not None:
    # Read from WORKER_ID when the module was imported.
    interceptor.WorkerIdInterceptor._worker_id = os.environ.get('WORKER_ID')  # pylint: disable=protected-access
  util = sys.modules.get('apache_beam.transforms.util')
  if util is not None:
    import uuid
    # GroupIntoBatches.WithShardedKey's shard ids are unique per process.
    util.GroupIntoBatches.WithShardedKey._shard_id_prefix = uuid.uuid4().bytes  # pylint: disable=protected-access
  np_random = sys.modules.get('numpy.random')
  if np_random is not None:
    np_random.seed()
  # `python -m` runs the module as a fresh __main__ only: the imported copy
  # goes, and this script's namespace is not the harness's.
  sys.modules.pop(module, None)
  import types
  sys.modules['__main__'] = types.ModuleType('__main__')


def become_harness(module, request, fds, parent, inherited):
  """In the forked child: closes the fork server's files (`inherited`),
  takes the caller's standard streams, environment and folder, then runs the
  SDK harness as `python -m` would. Ends the process: the harness's end, or
  its uncaught exception, unwinds to the interpreter's own exit."""
  try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the fork server died before prctl
      os._exit(1)
    for f in inherited:
      f.close()
    for target, fd in enumerate(fds):
      os.dup2(fd, target)
      os.close(fd)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for s in (signal.SIGTERM, signal.SIGCHLD):
      signal.signal(s, signal.SIG_DFL)
    os.chdir(request['cwd'])
    if request.get('cpus'):
      # This thread's; the threads the harness starts inherit it.
      try:
        os.sched_setaffinity(0, request['cpus'])
      except OSError as e:
        print('weir fork server: the harness runs unpinned: %s' % e, file=sys.stderr)
    os.environ.clear()
    os.environ.update(request['env'])
    reseed(module)
    if not sys.flags.safe_path:
      sys.path[0] = os.getcwd()
    sys.argv = ['-m'] + list(request['argv'])
  except BaseException:  # pylint: disable=broad-except
    traceback.print_exc()
    sys.stderr.flush()
    os._exit(1)
  import runpy
  try:
    runpy._run_module_as_main(module, alter_argv=True)  # pylint: disable=protected-access
  except Exception:  # pylint: disable=broad-except
    # Reported as the interpreter reports an uncaught exception; it must not
    # reach the fork server's loop, which goes on after errors.
    sys.excepthook(*sys.exc_info())
    raise SystemExit(1)
  # SystemExit and KeyboardInterrupt unwind to the interpreter's own exit.
  raise SystemExit(0)


def read_request(conn):
  """The request line and the three descriptors sent with it."""
  conn.settimeout(REQUEST_TIMEOUT_S)
  data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
  try:
    while not data.endswith(b'\n'):
      more = conn.recv(1 << 16)
      if not more:
        raise ValueError('the request ended before its end of line')
      data += more
    if len(fds) != 3:
      raise ValueError('expected 3 file descriptors, got %d' % len(fds))
    request = json.loads(data)
  except BaseException:
    for fd in fds:
      os.close(fd)
    raise
  conn.settimeout(None)
  return request, fds


def main(path, module):
  # What `python -m MODULE` imports: the cost each harness would pay.
  import importlib
  importlib.import_module(module)
  # Harness exits are watched through pidfds: fail now if there are none.
  os.close(os.pidfd_open(os.getpid()))
  # What is here now stays: the forks' collections skip it (and so do not
  # copy its pages).
  gc.freeze()
  listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
  listener.bind(path + '.tmp')
  listener.listen(64)
  os.rename(path + '.tmp', path)
  sel = selectors.DefaultSelector()
  sel.register(listener, selectors.EVENT_READ, ('accept', None))
  sel.register(sys.stdin, selectors.EVENT_READ, ('parent', None))
  harnesses = {}  # pid -> [conn or None, pidfd]
  me = os.getpid()
  imported = stamp(module)
  stale = []

  def drop_caller(pid):
    conn = harnesses[pid][0]
    if conn is not None:
      harnesses[pid][0] = None
      sel.unregister(conn)
      conn.close()

  def reap(pid):
    """The harness exited (its pidfd is readable): tell its caller."""
    conn, pidfd = harnesses.pop(pid)
    _, status = os.waitpid(pid, 0)
    sel.unregister(pidfd)
    os.close(pidfd)
    if conn is not None:
      sel.unregister(conn)
      try:
        conn.sendall(b'exit %d\n' % os.waitstatus_to_exitcode(status))
      except OSError:
        pass
      conn.close()

  def accept():
    conn, _ = listener.accept()
    try:
      request, fds = read_request(conn)
    except Exception as e:  # pylint: disable=broad-except
      refuse(conn, e)
      return
    try:
      changed = stale or stamp(module) != imported
    except OSError:
      changed = True
    if changed:
      # Forks would run the old code beside new files: each caller starts
      # its own interpreter until this fork server's harnesses end.
      stale.append(True)
      for fd in fds:
        os.close(fd)
      refuse(conn, '%s changed on disk since the fork server imported it' % module)
      return
    try:
      child = os.fork()
    except OSError as e:
      for fd in fds:
        os.close(fd)
      refuse(conn, e)
      return
    if child == 0:
      inherited = [listener, conn, sel]
      for c, _ in harnesses.values():
        if c is not None:
          inherited.append(c)
      inherited += [PidFd(p) for _, p in harnesses.values()]
      become_harness(module, request, fds, me, inherited)
    for fd in fds:
      os.close(fd)
    harnesses[child] = [conn, os.pidfd_open(child)]
    sel.register(conn, selectors.EVENT_READ, ('caller', child))
    sel.register(harnesses[child][1], selectors.EVENT_READ, ('exited', child))
    try:
      conn.sendall(b'pid %d\n' % child)
    except OSError:
      pass

  while True:
    for key, _ in sel.select():
      what, pid = key.data
      try:
        if what == 'parent':
          if not os.read(sys.stdin.fileno(), 4096):
            for p in list(harnesses):
              kill(p)
            for p in list(harnesses):
              reap(p)
            return
        elif what == 'accept':
          accept()
        elif what == 'caller' and pid in harnesses:
          # The caller sends nothing more: readable means gone (or reset).
          try:
            gone = not key.fileobj.recv(1)
          except OSError:
            gone = True
          if gone:
            drop_caller(pid)
            kill(pid)
        elif what == 'exited' and pid in harnesses:
          reap(pid)
        if stale and not harnesses:
          sys.exit(STALE)
      except Exception:  # pylint: disable=broad-except
        # One request's trouble must not end the others' harnesses.
        traceback.print_exc()
        sys.stderr.flush()


class PidFd:
  """A pidfd as a file to close."""

  def __init__(self, fd):
    self.fd = fd

  def close(self):
    os.close(self.fd)


def kill(pid):
  try:
    os.kill(pid, signal.SIGKILL)
  except ProcessLookupError:
    pass


def refuse(conn, why):
  try:
    conn.sendall(b'error %s\n' % str(why).replace('\n', ' ').encode())
  except OSError:
    pass
  conn.close()


if __name__ == '__main__':
  main(sys.argv[1], sys.argv[2])
