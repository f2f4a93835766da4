"""Packages a Python job ships to its workers (`--extra_package`,
`--setup_file`, `--requirements_file`): under a PROCESS environment
(`weir boot --python`) they are pip-installed before the SDK harness starts,
as Beam's container boot does, so a DoFn can import them; the install goes
into the worker's own folder, not the interpreter's environment. A package
that cannot be installed fails the job with pip's complaint, and the server
goes on serving.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import read_output

MODULE = 'weir_extra_demo'

PIPELINE = textwrap.dedent('''
    import sys
    import apache_beam as beam
    from apache_beam.options.pipeline_options import PipelineOptions

    output, argv = sys.argv[1], sys.argv[2:]
    with beam.Pipeline(options=PipelineOptions(argv)) as p:
      (p | beam.Create(['lear', 'cordelia', 'kent'])
         | beam.Map(lambda w: __import__('%s').shout(w))
         | beam.io.WriteToText(output))
''' % MODULE)


def make_package(folder, body):
  """A source package `weir_extra_demo` (setup.py and one module) in
  `folder`; returns its setup.py."""
  folder.mkdir()
  (folder / 'setup.py').write_text(
      'from setuptools import setup\n'
      "setup(name='weir-extra-demo', version='0.1', py_modules=['%s'])\n" % MODULE)
  (folder / (MODULE + '.py')).write_text(body)
  return folder / 'setup.py'


def sdist(setup_py):
  """Builds the package's source distribution; returns its path."""
  folder = setup_py.parent
  subprocess.run([sys.executable, 'setup.py', '-q', 'sdist', '--dist-dir', 'dist'],
                 cwd=folder, check=True, capture_output=True)
  (built,) = (folder / 'dist').iterdir()
  return built


@pytest.fixture(scope='module')
def package(tmp_path_factory):
  tmp = tmp_path_factory.mktemp('packages')
  return make_package(tmp / 'demo', 'def shout(word):\n  return word.upper() + "!"\n')


def run(beam, tmp_path, extra, mode='PROCESS'):
  script = tmp_path / 'pipeline.py'
  script.write_text(PIPELINE)
  out = tmp_path / 'out' / 'shouts'
  return beam.run([script, out] + list(extra) + beam.options(mode), str(out), 'packages'), out


def assert_not_in_interpreter():
  probe = subprocess.run([sys.executable, '-c', 'import ' + MODULE], capture_output=True)
  assert probe.returncode != 0, 'the package was installed into the interpreter: %s' % sys.executable


@pytest.mark.parametrize('how', ['extra_package', 'setup_file'])
def test_a_shipped_package_is_importable_in_the_harness(beam, tmp_path, package, how):
  assert_not_in_interpreter()
  option = ('--extra_package=%s' % sdist(package) if how == 'extra_package'
            else '--setup_file=%s' % package)
  result, out = run(beam, tmp_path, [option])
  assert result.returncode == 0, result.describe(beam.server)
  _, lines = read_output(str(out))
  assert sorted(lines.elements()) == ['CORDELIA!', 'KENT!', 'LEAR!']
  assert_not_in_interpreter()


def test_requirements_the_interpreter_has_install_offline(beam, tmp_path, package):
  """A requirements file whose packages the interpreter already has (here
  `requests`, a dependency of Beam), and a local package in it, which the SDK
  turns into an extra package: nothing is fetched from an index
  (--requirements_cache=skip) and the job runs."""
  requirements = tmp_path / 'requirements.txt'
  requirements.write_text('requests\n%s\n' % sdist(package))
  beam.options('PROCESS')  # starts the server, whose log is read below
  before = beam.server.log_size()
  result, out = run(beam, tmp_path, ['--requirements_file=%s' % requirements,
                                     '--requirements_cache=skip'])
  assert result.returncode == 0, result.describe(beam.server)
  # The first, offline pass installed it: no worker went to the index.
  assert 'trying again with the package index' not in beam.server.log_since(before), \
      result.describe(beam.server)
  _, lines = read_output(str(out))
  assert sorted(lines.elements()) == ['CORDELIA!', 'KENT!', 'LEAR!']


def test_a_package_that_does_not_install_fails_the_job_and_the_server_serves_on(
    beam, tmp_path, package):
  broken = make_package(tmp_path / 'broken', 'def shout(word):\n  return word\n')
  broken.write_text('raise SystemExit("weir-demo: this package refuses to build")\n')
  tarball = tmp_path / 'weir-broken-0.1.tar.gz'
  subprocess.run(['tar', 'czf', tarball, '-C', tmp_path, 'broken'], check=True)
  (tmp_path / 'first').mkdir()
  failed, _ = run(beam, tmp_path / 'first', ['--extra_package=%s' % tarball])
  assert failed.returncode != 0, failed.describe(beam.server)
  text = failed.stderr + beam.server.log_tail(400)
  assert 'pip could not install the job' in text, failed.describe(beam.server)
  assert 'weir-broken-0.1.tar.gz' in text, failed.describe(beam.server)
  # The same server runs the next job, with a package that installs.
  (tmp_path / 'second').mkdir()
  ok, out = run(beam, tmp_path / 'second', ['--extra_package=%s' % sdist(package)])
  assert ok.returncode == 0, ok.describe(beam.server)
  _, lines = read_output(str(out))
  assert sorted(lines.elements()) == ['CORDELIA!', 'KENT!', 'LEAR!']
