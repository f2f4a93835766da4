"""Runs a command and stops it when this process's standard input closes.

WeirRunner starts ``weir serve`` through this script::

    python -I -S _watchdog.py -- /path/to/weir serve --job_port 0

and keeps the write end of the script's stdin pipe. The pipe closes when
WeirRunner stops the server, and also when the Python process that started it
dies in any way (an exception, SIGTERM, SIGKILL, os._exit), so the server
never outlives its client. The script then sends the command SIGTERM, waits
up to GRACE_SECONDS, kills it if it is still there, and exits with the
command's exit code. SIGTERM or SIGHUP to the script does the same; SIGINT
is ignored (a terminal's Ctrl-C reaches the client, which stops the server).

The command runs in its own session, so terminal signals do not reach it,
with stdin from /dev/null and this script's stdout and stderr. The script's
first output line is ``weir watchdog: started pid PID``.

Only the standard library is used, so the script also runs with -I -S.
"""

import os
import signal
import subprocess
import sys
import threading
import time

GRACE_SECONDS = 10.0
POLL_SECONDS = 0.2


def main(argv):
  if len(argv) < 2 or argv[0] != '--':
    sys.stderr.write('usage: _watchdog.py -- COMMAND [ARGS...]\n')
    return 2
  # Set by the stdin thread and by the signal handlers (a plain flag: a
  # handler taking a lock could deadlock against the main thread).
  stop = []
  signal.signal(signal.SIGINT, signal.SIG_IGN)
  signal.signal(signal.SIGTERM, lambda *_: stop.append('signal'))
  if hasattr(signal, 'SIGHUP'):
    signal.signal(signal.SIGHUP, lambda *_: stop.append('signal'))
  try:
    child = subprocess.Popen(
        argv[1:], stdin=subprocess.DEVNULL, start_new_session=True)
  except OSError as e:
    sys.stderr.write('weir watchdog: cannot start %s: %s\n' % (argv[1], e))
    return 127
  sys.stdout.write('weir watchdog: started pid %d\n' % child.pid)
  sys.stdout.flush()

  def watch_stdin():
    try:
      while os.read(0, 4096):
        pass
    except OSError:
      pass
    stop.append('stdin closed')

  threading.Thread(target=watch_stdin, daemon=True).start()
  while child.poll() is None and not stop:
    time.sleep(POLL_SECONDS)
  if child.poll() is None:
    child.terminate()
    try:
      child.wait(GRACE_SECONDS)
    except subprocess.TimeoutExpired:
      sys.stderr.write(
          'weir watchdog: pid %d ignored SIGTERM for %.0f s; killing it\n' %
          (child.pid, GRACE_SECONDS))
      child.kill()
      child.wait()
  code = child.returncode
  return 128 - code if code < 0 else code


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
