"""The supervising runner harness: dead SDK harnesses are restarted, stuck
elements restart their harness (element_processing_timeout), and the worker
options size the job's SDK harnesses (num_workers, max_num_workers,
autoscaling_algorithm, number_of_worker_harness_threads)."""

import collections
import re

from conftest import SUPERVISION_PY

ONE_SDK = '--experiments=no_use_multiple_sdk_containers'


def run(beam, name, mode, *extra):
  return beam.run_named(name, mode, extra=list(extra), script=SUPERVISION_PY)


def restarting(text):
  """Workers whose restart the job's messages announce."""
  return re.findall(r'SDK harness (\S+) [^\n]*?; restarting it', text)


def restarts(text):
  """(dead worker, replacement) pairs named in the job's messages."""
  return re.findall(r'SDK harness (\S+) [^\n]*?; restarted as (\S+)', text)


def test_only_sdk_process_killed_mid_bundle_is_restarted(beam, weir_server):
  expected = run(beam, 'crash_once', 'DIRECT')
  assert expected.returncode == 0, expected.describe()
  got = run(beam, 'crash_once', 'PROCESS', ONE_SDK)
  assert got.returncode == 0, (
      'the job must survive the death of its only SDK harness\n' +
      got.describe(weir_server))
  assert got.output()[1] == expected.output()[1], (
      dict(got.output()[1]), dict(expected.output()[1]))
  assert 'starting 1 SDK harness(es) per environment' in got.stderr, got.describe()
  pairs = restarts(got.stderr)
  assert len(pairs) == 1, (pairs, got.describe(weir_server))
  assert restarting(got.stderr) == [pairs[0][0]], got.describe()
  dead, new = pairs[0]
  assert dead != new
  assert re.search(r'SDK harness %s died \([^)]*\), exit status 17; restarted as %s' %
                   (re.escape(dead), re.escape(new)), got.stderr), got.describe()


def test_stuck_element_restarts_harness_and_fails_batch_job_after_four(beam, weir_server):
  got = run(beam, 'stuck', 'PROCESS', ONE_SDK,
            '--experiments=weir_test_element_processing_timeout_seconds=3')
  assert got.returncode == 3, (
      'a batch job whose element is stuck on every attempt must fail\n' +
      got.describe(weir_server))
  assert 'element processing timeout 3s' in got.stderr, got.describe()
  stuck = restarting(got.stderr)
  assert len(stuck) == 4, (stuck, got.describe(weir_server))
  for dead in stuck:
    assert re.search(
        r'SDK harness %s was stuck: an element of transform SleepyTransform made no '
        r'progress for \d+s \(element processing timeout 3s\); restarting it' % re.escape(dead),
        got.stderr), got.describe()
  # Each retry ran on the harness started in place of the stuck one (the
  # job fails before the last replacement is up).
  pairs = restarts(got.stderr)
  assert pairs == list(zip(stuck[:-1], stuck[1:])), (pairs, stuck)
  error = got.client_error()
  assert error and 'bundle failed 4 times' in error, (error, got.describe())
  assert 'SleepyTransform' in error and 'element processing timeout 3s' in error, error
  assert weir_server.alive(), weir_server.log_tail()


def test_slow_bundle_of_quick_elements_is_not_stuck(beam, weir_server):
  got = run(beam, 'steady', 'PROCESS', ONE_SDK,
            '--experiments=weir_test_element_processing_timeout_seconds=3')
  assert got.returncode == 0, got.describe(weir_server)
  assert got.output()[1] == collections.Counter('t%d' % i for i in range(8))
  assert restarting(got.stderr) == [], got.describe()


def test_stuck_element_in_streaming_job_is_retried_without_cap(beam, weir_server):
  got = run(beam, 'stuck', 'PROCESS', ONE_SDK, '--streaming',
            '--experiments=weir_test_element_processing_timeout_seconds=2',
            '--cancel_after', '50')
  assert 'CANCELLED' in (got.stdout + got.stderr), got.describe(weir_server)
  stuck = restarting(got.stderr)
  assert len(stuck) > 4, (stuck, got.describe(weir_server))
  assert 'bundle failed' not in got.stderr, got.describe()


def test_throughput_based_autoscaling_follows_the_backlog(beam, weir_server):
  # One bundle per harness: the backlog is then many bundles deep.
  got = run(beam, 'backlog', 'PROCESS', ONE_SDK, '--num_workers=1',
            '--max_num_workers=3', '--autoscaling_algorithm=THROUGHPUT_BASED',
            '--number_of_worker_harness_threads=1')
  assert got.returncode == 0, got.describe(weir_server)
  total = sum(b * 10 + i for b in range(3) for i in range(4))
  assert got.output()[1] == collections.Counter(['total %d of 12' % total])
  text = got.stderr
  assert 'between 1 and 3 SDK harness(es) per environment' in text, got.describe()
  ups = [(int(a), int(b)) for a, b in re.findall(r'scaling from (\d+) to (\d+) SDK harness\(es\) \(at most 3\)', text)]
  downs = [(int(a), int(b)) for a, b in re.findall(r'stopped it, scaling from (\d+) to (\d+) SDK harness\(es\) \(at least 1\)', text)]
  assert ups and all(1 <= a < b <= 3 for a, b in ups), (ups, got.describe())
  assert downs and all(a - 1 == b >= 1 for a, b in downs), (downs, got.describe())


def test_autoscaling_none_keeps_num_workers(beam, weir_server):
  got = run(beam, 'backlog', 'PROCESS', ONE_SDK, '--num_workers=2',
            '--max_num_workers=3', '--autoscaling_algorithm=NONE')
  assert got.returncode == 0, got.describe(weir_server)
  assert 'starting 2 SDK harness(es) per environment (2 worker(s)' in got.stderr, got.describe()
  assert 'autoscaling (THROUGHPUT_BASED)' not in got.stderr, got.describe()


def _max_overlap_per_process(lines):
  """Most bundles that ran at once in one SDK process, from `pid x start end` lines."""
  by_pid = collections.defaultdict(list)
  for line in lines:
    pid, _, start, end = line.split()
    by_pid[pid].append((float(start), float(end)))
  best = 0
  for spans in by_pid.values():
    for s, _ in spans:
      best = max(best, sum(1 for a, b in spans if a <= s < b))
  return best


def test_number_of_worker_harness_threads_is_concurrent_bundles_per_harness(beam, weir_server):
  one = run(beam, 'overlap', 'PROCESS', ONE_SDK, '--number_of_worker_harness_threads=1')
  assert one.returncode == 0, one.describe(weir_server)
  assert 'runs up to 1 bundle(s) at a time (number_of_worker_harness_threads)' in one.stderr, \
      one.describe()
  assert _max_overlap_per_process(one.output()[1]) == 1, dict(one.output()[1])

  # Unset, a Python SDK harness runs two bundles at a time per core it
  # stands for: here the worker's only one, for all its cores.
  two = run(beam, 'overlap', 'PROCESS', ONE_SDK)
  assert two.returncode == 0, two.describe(weir_server)
  said = re.search(r'runs up to (\d+) bundle\(s\) at a time \(([^)]*)\)', two.stderr)
  assert said, two.describe()
  bundles, why = int(said.group(1)), said.group(2)
  if why == 'the default for an SDK that does not declare beam:protocol:multi_core_bundle_processing:v1':
    assert bundles == 2, said.group(0)  # a one-core machine
  else:
    assert why == ('two per core: a worker runs one SDK harness, for all its cores, of an SDK '
                   'that does not declare beam:protocol:multi_core_bundle_processing:v1'), said.group(0)
    assert bundles >= 4 and bundles % 2 == 0, said.group(0)
  lines = two.output()[1]
  assert len({l.split()[0] for l in lines}) == 1, dict(lines)
  assert _max_overlap_per_process(lines) == 2, dict(lines)


def test_loopback_runs_one_sdk_harness_with_two_bundles_per_core(beam, weir_server):
  # LOOPBACK's harnesses are threads of the client's one interpreter: one
  # harness, with the bundles of all the worker's cores, not one per core.
  with open(weir_server.log_path, encoding='utf-8', errors='replace') as f:
    seen = len(f.readlines())
  got = run(beam, 'overlap', 'LOOPBACK')
  assert got.returncode == 0, got.describe(weir_server)
  with open(weir_server.log_path, encoding='utf-8', errors='replace') as f:
    log = ''.join(f.readlines()[seen:])
  assert ("starting 1 SDK harness(es) per environment (1 worker(s) of 1 SDK harness(es) each) "
          "(one per worker: the environment is the client's in-process worker pool, "
          "--environment_type=LOOPBACK)") in got.stderr, got.describe()
  assert log.count('SDK harness connected (control)') == 1, log
  # Its two slow bundles still ran at once.
  lines = got.output()[1]
  assert _max_overlap_per_process(lines) == 2, dict(lines)
