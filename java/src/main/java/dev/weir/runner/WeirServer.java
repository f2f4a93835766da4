package dev.weir.runner;

import java.io.BufferedReader;
import java.io.File;
import java.io.IOException;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.TimeoutException;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.checkerframework.checker.nullness.qual.Nullable;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A {@code weir serve} process started by {@link WeirRunner} when no {@code --jobEndpoint} is
 * given: it listens on a free port ({@code --job_port=0}) and is stopped by {@link #close()}.
 *
 * <p>The port is read from the server's start-up line on stderr ({@code weir: Beam Job API
 * listening on 127.0.0.1:PORT}); every other line of its output goes to this class's logger.
 */
public final class WeirServer implements AutoCloseable {
  private static final Logger LOG = LoggerFactory.getLogger(WeirServer.class);
  private static final Pattern LISTENING = Pattern.compile("listening on (\\S+:\\d+)");

  private final Process process;
  private final String endpoint;

  private WeirServer(Process process, String endpoint) {
    this.process = process;
    this.endpoint = endpoint;
  }

  /** The Job API endpoint, {@code host:port}. */
  public String getEndpoint() {
    return endpoint;
  }

  /**
   * The weir binary to use: {@code explicit} if set, else {@code $WEIR_BIN}, else the first
   * {@code weir} on the {@code PATH}.
   *
   * @throws IllegalStateException naming the three places looked at when none is found
   */
  public static String findBinary(@Nullable String explicit) {
    if (explicit != null && !explicit.isEmpty()) {
      return explicit;
    }
    String env = System.getenv("WEIR_BIN");
    if (env != null && !env.isEmpty()) {
      return env;
    }
    String path = System.getenv("PATH");
    if (path != null) {
      for (String dir : path.split(File.pathSeparator)) {
        File candidate = new File(dir, "weir");
        if (candidate.isFile() && candidate.canExecute()) {
          return candidate.getAbsolutePath();
        }
      }
    }
    throw new IllegalStateException(
        "No weir binary: give --jobEndpoint=host:port of a running `weir serve`, or"
            + " --weirBinary=PATH, or set WEIR_BIN, or put `weir` on the PATH");
  }

  /**
   * Starts {@code <binary> serve --job_port=0} and waits (at most {@code timeoutSeconds}) until it
   * reports its port.
   *
   * @throws IOException if the process cannot start, exits early, or reports no port in time
   */
  public static WeirServer start(String binary, int timeoutSeconds) throws IOException {
    List<String> command = new ArrayList<>();
    command.add(binary);
    command.add("serve");
    command.add("--job_port=0");
    ProcessBuilder builder = new ProcessBuilder(command).redirectErrorStream(true);
    Process process;
    try {
      process = builder.start();
    } catch (IOException e) {
      throw new IOException("cannot start " + String.join(" ", command) + ": " + e.getMessage(), e);
    }
    CompletableFuture<String> port = new CompletableFuture<>();
    java.util.Deque<String> tail = new java.util.ArrayDeque<>();
    Thread reader =
        new Thread(
            () -> {
              try (BufferedReader out =
                  new BufferedReader(
                      new InputStreamReader(process.getInputStream(), StandardCharsets.UTF_8))) {
                String line;
                while ((line = out.readLine()) != null) {
                  Matcher m = LISTENING.matcher(line);
                  if (!port.isDone() && m.find()) {
                    port.complete(m.group(1));
                  }
                  LOG.debug("weir serve: {}", line);
                  if (!port.isDone()) {
                    synchronized (tail) {
                      if (tail.size() >= 20) {
                        tail.removeFirst();
                      }
                      tail.addLast(line);
                    }
                  }
                }
              } catch (IOException e) {
                LOG.debug("weir serve output closed", e);
              }
              port.completeExceptionally(
                  new IOException("`weir serve` exited before it reported its port"));
            },
            "weir-serve-output");
    reader.setDaemon(true);
    reader.start();
    try {
      String endpoint = port.get(timeoutSeconds, TimeUnit.SECONDS);
      LOG.info("Started {} serve at {}", binary, endpoint);
      return new WeirServer(process, endpoint);
    } catch (TimeoutException e) {
      process.destroyForcibly();
      throw new IOException(
          "`" + binary + " serve` reported no port within " + timeoutSeconds + " s", e);
    } catch (InterruptedException e) {
      process.destroyForcibly();
      Thread.currentThread().interrupt();
      throw new IOException("interrupted while starting `weir serve`", e);
    } catch (java.util.concurrent.ExecutionException e) {
      process.destroyForcibly();
      String output;
      synchronized (tail) {
        output = String.join("\n", tail);
      }
      throw new IOException(
          e.getCause().getMessage() + " (exit " + exitCode(process) + "); its output:\n" + output,
          e);
    }
  }

  private static String exitCode(Process process) {
    try {
      return process.waitFor(5, TimeUnit.SECONDS) ? String.valueOf(process.exitValue()) : "?";
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
      return "?";
    }
  }

  /** Stops the server: SIGTERM, then SIGKILL after 10 s. */
  @Override
  public void close() {
    process.destroy();
    try {
      if (!process.waitFor(10, TimeUnit.SECONDS)) {
        process.destroyForcibly();
      }
    } catch (InterruptedException e) {
      process.destroyForcibly();
      Thread.currentThread().interrupt();
    }
  }
}
