package dev.weir.runner;

import java.util.ArrayList;
import java.util.List;
import java.util.function.Predicate;
import org.apache.beam.sdk.PipelineRunner;
import org.apache.beam.sdk.options.PipelineOptions;
import org.apache.beam.sdk.options.PipelineOptionsRegistrar;
import org.apache.beam.sdk.runners.PipelineRunnerRegistrar;
import org.apache.beam.sdk.util.common.ReflectHelpers;

/**
 * Registers {@link WeirRunner}, {@link TestWeirRunner}, {@link WeirPipelineOptions} and {@link
 * DataflowCompatibleOptions} with Beam (through {@code META-INF/services}), so {@code
 * --runner=WeirRunner}, {@code --weirBinary} and Dataflow's {@code --numWorkers} parse.
 */
public final class WeirRunnerRegistrar {
  private WeirRunnerRegistrar() {}

  /** The runners, by simple name: {@code WeirRunner}, {@code TestWeirRunner}. */
  public static final class Runners implements PipelineRunnerRegistrar {
    @Override
    public Iterable<Class<? extends PipelineRunner<?>>> getPipelineRunners() {
      return List.of(WeirRunner.class, TestWeirRunner.class);
    }
  }

  /**
   * The options interfaces: {@link WeirPipelineOptions}, and Dataflow's options as {@link
   * DataflowCompatibleOptions} (when Dataflow's runner jar, which declares them itself, is absent)
   * and {@link DataflowCompatibleOptions.Gcp} (when Beam's {@code GcpOptions} is absent too).
   */
  public static final class Options implements PipelineOptionsRegistrar {
    static final String DATAFLOW_OPTIONS =
        "org.apache.beam.runners.dataflow.options.DataflowPipelineOptions";
    static final String GCP_OPTIONS = "org.apache.beam.sdk.extensions.gcp.options.GcpOptions";

    @Override
    public Iterable<Class<? extends PipelineOptions>> getPipelineOptions() {
      return options(Options::onClasspath);
    }

    /** The interfaces to register, given which classes are on the classpath. */
    static List<Class<? extends PipelineOptions>> options(Predicate<String> onClasspath) {
      List<Class<? extends PipelineOptions>> options = new ArrayList<>();
      options.add(WeirPipelineOptions.class);
      if (!onClasspath.test(DATAFLOW_OPTIONS)) {
        options.add(DataflowCompatibleOptions.class);
        if (!onClasspath.test(GCP_OPTIONS)) {
          options.add(DataflowCompatibleOptions.Gcp.class);
        }
      }
      return options;
    }

    private static boolean onClasspath(String className) {
      try {
        Class.forName(className, false, ReflectHelpers.findClassLoader());
        return true;
      } catch (ClassNotFoundException | LinkageError e) {
        return false;
      }
    }
  }
}
