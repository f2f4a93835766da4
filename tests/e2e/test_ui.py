"""The web UI and Prometheus endpoint of `weir serve` (--ui_port).

* A batch job's counts on /metrics and /api/jobs/ID equal GetJobMetrics'
  (the SDKs' element counts per PCollection and the user counter).
* During a streaming job /metrics moves: stage element counts and a
  watermark grow between two scrapes.
* The browser test (ui/tests/ui.test.mjs, headless Debian chromium driven by
  playwright-core): jobs list, the job's graph with live counts, a watermark
  advancing, log filters, Drain → DRAINED. Screenshots are kept under
  ui/screenshots/ (WEIR_UI_SCREENSHOTS overrides).
"""

import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request

import grpc
import pytest

from conftest import REPO, WEIR_BIN, free_port, weir_jobs
from test_drain import start_job

HERE = os.path.dirname(os.path.abspath(__file__))


def get(server, path):
  with urllib.request.urlopen(server.ui + path, timeout=10) as r:
    return r.read().decode('utf-8')


def scrape(server):
  """/metrics as {(name, frozenset(labels)): value}."""
  out = {}
  for line in get(server, '/metrics').splitlines():
    if not line or line.startswith('#'):
      continue
    m = re.match(r'^(\w+)(?:\{(.*)\})? (\S+)$', line)
    assert m, line
    labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ''))
    out[(m.group(1), labels)] = float(m.group(3))
  return out


def of_job(metrics, name, job):
  return {dict(l).get('pcollection') or dict(l).get('stage') or dict(l).get('name'): v
          for (n, l), v in metrics.items() if n == name and ('job_id', job) in l}


def job_metrics(server, job):
  from apache_beam.portability.api import beam_job_api_pb2
  from apache_beam.portability.api import beam_job_api_pb2_grpc
  from apache_beam.portability.api import metrics_pb2
  from apache_beam.runners.portability.fn_api_runner import fn_runner  # noqa: F401
  from apache_beam.metrics import monitoring_infos
  with grpc.insecure_channel(server.endpoint) as channel:
    stub = beam_job_api_pb2_grpc.JobServiceStub(channel)
    r = stub.GetJobMetrics(beam_job_api_pb2.GetJobMetricsRequest(job_id=job), timeout=10)
  counts, user = {}, {}
  for mi in r.metrics.committed:
    if mi.urn == monitoring_infos.ELEMENT_COUNT_URN:
      counts[mi.labels['PCOLLECTION']] = monitoring_infos.extract_counter_value(mi)
    elif mi.urn == monitoring_infos.USER_COUNTER_URN:
      user[mi.labels['NAME']] = monitoring_infos.extract_counter_value(mi)
  return counts, user


BATCH = r'''
import sys
import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import PipelineOptions
words = Metrics.counter('ui_test', 'words')
def count(w):
  words.inc()
  return w
with beam.Pipeline(options=PipelineOptions(sys.argv[1:])) as p:
  _ = (p | beam.Create(['a b c', 'b c', 'c'] * 500) | beam.FlatMap(str.split)
       | beam.Map(count) | beam.combiners.Count.PerElement())
'''


def test_metrics_and_job_view_match_get_job_metrics(weir_server, tmp_path):
  script = tmp_path / 'batch.py'
  script.write_text(BATCH)
  before = {j['id'] for j in json.loads(get(weir_server, '/api/jobs'))['jobs']}
  subprocess.run(
      [sys.executable, str(script), '--runner=PortableRunner', '--job_endpoint=' + weir_server.endpoint,
       '--environment_type=LOOPBACK', '--job_name=ui-batch'], check=True, timeout=300,
      stdout=subprocess.DEVNULL)
  jobs = [j for j in json.loads(get(weir_server, '/api/jobs'))['jobs'] if j['id'] not in before]
  assert [j['name'] for j in jobs] == ['ui-batch'] and jobs[0]['state'] == 'DONE', jobs
  job = jobs[0]['id']
  assert any(s.startswith('apache/beam_python') for s in jobs[0]['sdks']), jobs[0]
  counts, user = job_metrics(weir_server, job)
  assert user == {'words': 3000}, user
  metrics = scrape(weir_server)
  assert of_job(metrics, 'weir_pcollection_elements_total', job) == counts
  assert of_job(metrics, 'weir_user_counter_total', job) == {'words': 3000}
  assert metrics[('weir_job_state', frozenset({('job_id', job), ('job_name', 'ui-batch'), ('state', 'DONE')}))] == 1
  view = json.loads(get(weir_server, '/api/jobs/' + job))
  # The engine's own counts: the Create's 1,500 lines reach the FlatMap's
  # stage, which emits 3,000 words; three distinct words are counted.
  stages = {s['index']: s for s in view['graph']['stages']}
  ins = [p['elements_in'] for p in view['progress']]
  assert 1500 in ins, view['progress']
  by_kind = [(stages[p['index']]['kind'], p['elements_in'], p['elements_out']) for p in view['progress']]
  assert ('Impulse', 0, 1) in by_kind, by_kind
  assert all(p['input_watermark'] == 'done' for p in view['progress'] if p['reported']), view['progress']
  assert view['user_metrics'] == [
      {'kind': 'sum_int64', 'name': 'words', 'namespace': 'ui_test', 'step': view['user_metrics'][0]['step'], 'value': 3000}]
  pcs = {p['id']: p['elements'] for p in view['graph']['pcollections']}
  assert all(pcs[pc] == n for pc, n in counts.items() if pc in pcs), (pcs, counts)
  # The same counts in `weir jobs describe` and in `weir jobs watch` (not
  # on a terminal: the table once, and the job has ended).
  described = weir_jobs(weir_server, 'describe', job)
  table = described.split('stages:\n')[1].split('history:')[0].splitlines()[1:]
  rows = [l.split() for l in table]
  assert [r[0] for r in rows] == [stages[p['index']]['kind'] for p in view['progress']], described
  ins_outs = [(int(r[-5]), int(r[-4])) for r in rows]
  assert ins_outs == [(p['elements_in'], p['elements_out']) for p in view['progress']], described
  watched = weir_jobs(weir_server, 'watch', job)
  assert 'DONE' in watched.splitlines()[0] and len(watched.splitlines()) == 1 + len(rows), watched
  assert all('wm done' in l or 'wm -' in l for l in watched.splitlines()[1:]), watched
  logs = json.loads(get(weir_server, '/api/jobs/%s/logs' % job))
  assert any('finished' in e['text'] for e in logs['entries']), logs
  later = json.loads(get(weir_server, '/api/jobs/%s/logs?after=%d' % (job, logs['last'])))
  assert later['entries'] == [], later
  with pytest.raises(urllib.error.HTTPError) as bad:
    get(weir_server, '/api/jobs/%s/logs?after=abc' % job)
  assert bad.value.code == 400 and 'expects the index of a log line' in bad.value.read().decode(), bad.value


def screenshots_dir():
  return os.environ.get('WEIR_UI_SCREENSHOTS', str(REPO / 'ui' / 'screenshots'))


def test_browser_watches_a_streaming_job_and_drains_it(weir_server, tmp_path):
  node = shutil.which('node')
  chromium = os.environ.get('WEIR_CHROMIUM', '/usr/bin/chromium')
  if not node or not os.access(chromium, os.X_OK) or not (REPO / 'ui' / 'node_modules' / 'playwright-core').is_dir():
    pytest.fail('the browser test needs node, %s (Debian package chromium) and ui/node_modules '
                '(npm ci --prefix ui); scripts/setup.sh installs them' % chromium)
  output = tmp_path / 'counts.txt'
  client, job = start_job(weir_server, output)
  try:
    # /metrics moves while the job runs.
    first = scrape(weir_server)
    time.sleep(2.5)
    second = scrape(weir_server)
    ins = lambda m: sum(of_job(m, 'weir_stage_elements_in_total', job).values())
    assert ins(second) > ins(first) > 0, (ins(first), ins(second))
    wm = lambda m: max(of_job(m, 'weir_stage_input_watermark_seconds', job).values() or [0])
    assert wm(second) > wm(first) > 0, (wm(first), wm(second))
    r = subprocess.run(
        [node, str(REPO / 'ui' / 'tests' / 'ui.test.mjs'), '--base', weir_server.ui, '--job', job,
         '--out', screenshots_dir(), '--chromium', chromium],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=240)
    assert r.returncode == 0, r.stdout
    out, _ = client.communicate(timeout=60)
    assert 'DRAINED' in out, out
  finally:
    if client.poll() is None:
      client.kill()
  for name in ('jobs.png', 'job-running.png', 'job-drained.png'):
    assert os.path.getsize(os.path.join(screenshots_dir(), name)) > 10_000, name
  assert weir_server.alive(), weir_server.log_tail()


def test_the_ui_needs_the_job_api_token_when_the_server_has_one(tmp_path):
  port, ui_port = free_port(), free_port()
  proc = subprocess.Popen(
      [str(WEIR_BIN), 'serve', '--job_port', str(port), '--ui_port', str(ui_port),
       '--auth_token', 's3cret', '--staging_dir', str(tmp_path / 'staging')],
      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  base = 'http://127.0.0.1:%d' % ui_port
  try:
    class NoRedirect(urllib.request.HTTPRedirectHandler):
      def redirect_request(self, *args, **kwargs):
        return None
    opener = urllib.request.build_opener(NoRedirect)
    def status(path, headers=None):
      request = urllib.request.Request(base + path, headers=headers or {})
      try:
        with opener.open(request, timeout=5) as r:
          return r.status, {k.lower(): v for k, v in r.headers.items()}
      except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}
    deadline = time.time() + 30
    while True:
      try:
        status('/')
        break
      except OSError:
        assert time.time() < deadline and proc.poll() is None, 'the web UI never answered'
        time.sleep(0.2)
    for path in ('/', '/api/jobs', '/metrics', '/jobs/x', '/assets/app.js'):
      assert status(path)[0] == 401, path
      assert status(path, {'Authorization': 'Bearer wrong'})[0] == 401, path
    assert status('/api/jobs', {'Authorization': 'Bearer s3cret'})[0] == 200
    # ?token= sets the cookie and sends the browser on without the token in its URL.
    code, headers = status('/jobs/x?token=s3cret&y=1')
    assert code == 303 and headers.get('set-cookie', '').startswith('weir_token=s3cret;'), headers
    assert headers['location'] == '/jobs/x?y=1' and headers['referrer-policy'] == 'no-referrer', headers
    assert status('/metrics', {'Cookie': 'weir_token=s3cret'})[0] == 200
    assert status('/api/jobs', {'Cookie': 'weir_token=nope'})[0] == 401
  finally:
    proc.terminate()
    proc.wait(timeout=10)


def test_the_ui_refuses_rebound_host_names_and_cross_origin_posts(weir_server):
  """Without a token: a Host that is a DNS name is refused (DNS rebinding),
  and so is a POST from another origin (CSRF); a same-origin POST works."""
  def call(path, method='GET', headers=None):
    request = urllib.request.Request(weir_server.ui + path, method=method, headers=headers or {})
    try:
      with urllib.request.urlopen(request, timeout=5) as r:
        return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
      return e.code, e.read().decode()
  port = weir_server.ui.rsplit(':', 1)[1]
  assert call('/api/jobs')[0] == 200
  assert call('/api/jobs', headers={'Host': 'localhost:' + port})[0] == 200
  code, text = call('/api/jobs', headers={'Host': 'attacker.example:' + port})
  assert code == 403 and 'DNS name' in text, text
  code, text = call('/api/jobs/nope/cancel', 'POST', {'Origin': 'http://127.0.0.1:1'})
  assert code == 403 and 'cross-origin' in text, text
  code, text = call('/api/jobs/nope/cancel', 'POST', {'Origin': weir_server.ui})
  assert code == 404 and 'no job nope' in text, text
