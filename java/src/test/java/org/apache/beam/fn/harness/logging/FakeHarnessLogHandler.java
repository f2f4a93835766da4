package org.apache.beam.fn.harness.logging;

import java.util.ArrayList;
import java.util.List;
import java.util.logging.Handler;
import java.util.logging.LogRecord;

/**
 * Stands in for the handler a LOOPBACK SDK harness installs on the root logger (its class is in
 * this package), keeping what would have been sent to Weir.
 */
public class FakeHarnessLogHandler extends Handler {
  public final List<String> sent = new ArrayList<>();

  @Override
  public synchronized void publish(LogRecord record) {
    sent.add(String.valueOf(record.getMessage()) + " " + java.util.Arrays.toString(record.getParameters()));
  }

  @Override
  public void flush() {}

  @Override
  public void close() {}
}
