package dev.weir.runner;

import java.util.List;
import org.apache.beam.sdk.PipelineRunner;
import org.apache.beam.sdk.options.PipelineOptions;
import org.apache.beam.sdk.options.PipelineOptionsRegistrar;
import org.apache.beam.sdk.runners.PipelineRunnerRegistrar;

/**
 * Registers {@link WeirRunner}, {@link TestWeirRunner} and {@link WeirPipelineOptions} with Beam
 * (through {@code META-INF/services}), so {@code --runner=WeirRunner} and {@code --weirBinary}
 * parse.
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

  /** The options interface {@link WeirPipelineOptions}. */
  public static final class Options implements PipelineOptionsRegistrar {
    @Override
    public Iterable<Class<? extends PipelineOptions>> getPipelineOptions() {
      return List.of(WeirPipelineOptions.class);
    }
  }
}
