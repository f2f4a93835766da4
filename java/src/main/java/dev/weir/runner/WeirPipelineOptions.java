package dev.weir.runner;

import org.apache.beam.sdk.options.Default;
import org.apache.beam.sdk.options.DefaultValueFactory;
import org.apache.beam.sdk.options.PipelineOptions;
import org.apache.beam.sdk.options.Description;
import org.apache.beam.sdk.options.PortablePipelineOptions;
import org.checkerframework.checker.nullness.qual.Nullable;

/**
 * Options of {@link WeirRunner}, on top of Beam's {@link PortablePipelineOptions}.
 *
 * <ul>
 *   <li>{@code --jobEndpoint=host:port}: a running {@code weir serve}. When absent, the runner
 *       starts {@code weir serve --job_port=0} itself (the binary from {@code --weirBinary},
 *       the {@code WEIR_BIN} environment variable, or {@code weir} on the {@code PATH}) and stops
 *       it when the job ends.
 *   <li>{@code --defaultEnvironmentType}: {@code LOOPBACK} (the default here: SDK harness threads
 *       in this JVM), {@code EXTERNAL} (a worker pool at {@code --defaultEnvironmentConfig}) or
 *       {@code PROCESS}. A {@code PROCESS} environment without {@code --defaultEnvironmentConfig}
 *       gets {@code {"command": "<weir> boot --java"}}, so Weir starts Java harnesses itself.
 * </ul>
 */
public interface WeirPipelineOptions extends PortablePipelineOptions {

  @Description(
      "Path of the weir binary, used to start `weir serve` when no --jobEndpoint is given and as"
          + " the boot command of PROCESS environments. Default: $WEIR_BIN, else `weir` on the"
          + " PATH.")
  @Nullable
  String getWeirBinary();

  void setWeirBinary(@Nullable String weirBinary);

  @Description(
      "Folder of the Java SDK harness jars that `weir boot --java` puts first on a PROCESS"
          + " worker's classpath (passed as --java_harness_classpath). Default: what weir boot"
          + " finds itself ($WEIR_JAVA_HARNESS_CLASSPATH, or java/target/harness-classpath of the"
          + " checkout the binary was built in).")
  @Nullable
  String getWeirJavaHarnessClasspath();

  void setWeirJavaHarnessClasspath(@Nullable String classpath);

  @Description(
      "Bundles Weir sends one SDK harness at a time (Dataflow's numberOfWorkerHarnessThreads,"
          + " declared as Dataflow declares it). 0, the default: Weir decides (16 for Java).")
  @Default.Integer(0)
  int getNumberOfWorkerHarnessThreads();

  void setNumberOfWorkerHarnessThreads(int threads);

  @Description(
      "Seconds to wait for a `weir serve` started by the runner to report its port.")
  @Default.Integer(60)
  int getWeirStartupTimeoutSeconds();

  void setWeirStartupTimeoutSeconds(int seconds);

  @Description(
      "Job API token of a `weir serve --auth_token` server, sent as `authorization: Bearer TOKEN`"
          + " metadata on every Job API and artifact staging call. Default: $WEIR_AUTH_TOKEN.")
  @Default.InstanceFactory(TokenFromEnvironment.class)
  @Nullable
  String getWeirAuthToken();

  void setWeirAuthToken(@Nullable String token);

  /** {@code $WEIR_AUTH_TOKEN}, or null. */
  class TokenFromEnvironment implements DefaultValueFactory<@Nullable String> {
    @Override
    public @Nullable String create(PipelineOptions options) {
      String token = System.getenv("WEIR_AUTH_TOKEN");
      return token == null || token.trim().isEmpty() ? null : token.trim();
    }
  }
}
