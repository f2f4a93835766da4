package dev.weir.examples;

import org.apache.beam.sdk.Pipeline;
import org.apache.beam.sdk.PipelineResult;
import org.apache.beam.sdk.io.TextIO;
import org.apache.beam.sdk.metrics.Counter;
import org.apache.beam.sdk.metrics.Distribution;
import org.apache.beam.sdk.metrics.Metrics;
import org.apache.beam.sdk.options.Default;
import org.apache.beam.sdk.options.Description;
import org.apache.beam.sdk.options.PipelineOptions;
import org.apache.beam.sdk.options.PipelineOptionsFactory;
import org.apache.beam.sdk.options.Validation;
import org.apache.beam.sdk.transforms.Count;
import org.apache.beam.sdk.transforms.DoFn;
import org.apache.beam.sdk.transforms.MapElements;
import org.apache.beam.sdk.transforms.ParDo;
import org.apache.beam.sdk.values.KV;
import org.apache.beam.sdk.values.TypeDescriptors;

/**
 * Beam's WordCount (as in Beam's Java examples): reads {@code --inputFile}, splits lines into
 * words on anything that is not a letter or an apostrophe, counts each word and writes {@code
 * word: count} lines to files starting with {@code --output}. It runs on any runner ({@code
 * --runner=WeirRunner}, {@code --runner=DirectRunner}); the end-to-end test compares the two.
 * After the run it prints the user metrics {@code emptyLines} and {@code lineLength} as {@code
 * metric NAME VALUE} lines.
 */
public final class WordCount {
  private WordCount() {}

  /** Splits a line into words; counts empty lines and records line lengths as metrics. */
  static final class ExtractWordsFn extends DoFn<String, String> {
    private final Counter emptyLines = Metrics.counter(ExtractWordsFn.class, "emptyLines");
    private final Distribution lineLength =
        Metrics.distribution(ExtractWordsFn.class, "lineLength");

    @ProcessElement
    public void processElement(@Element String line, OutputReceiver<String> out) {
      lineLength.update(line.length());
      if (line.trim().isEmpty()) {
        emptyLines.inc();
      }
      for (String word : line.split("[^\\p{L}']+", -1)) {
        if (!word.isEmpty()) {
          out.output(word);
        }
      }
    }
  }

  /** Options of the example. */
  public interface WordCountOptions extends PipelineOptions {
    @Description("File (or glob) to read")
    @Validation.Required
    String getInputFile();

    void setInputFile(String value);

    @Description("Prefix of the output files")
    @Validation.Required
    String getOutput();

    void setOutput(String value);

    @Description("Number of output shards (0: the runner decides)")
    @Default.Integer(0)
    int getNumShards();

    void setNumShards(int value);
  }

  /** Builds the pipeline on {@code p}. */
  static void build(Pipeline p, WordCountOptions options) {
    TextIO.Write write = TextIO.write().to(options.getOutput());
    if (options.getNumShards() > 0) {
      write = write.withNumShards(options.getNumShards());
    }
    p.apply("ReadLines", TextIO.read().from(options.getInputFile()))
        .apply("ExtractWords", ParDo.of(new ExtractWordsFn()))
        .apply("CountWords", Count.perElement())
        .apply(
            "Format",
            MapElements.into(TypeDescriptors.strings())
                .via((KV<String, Long> kv) -> kv.getKey() + ": " + kv.getValue()))
        .apply("WriteCounts", write);
  }

  /** Runs the pipeline and waits; exits 1 unless it ended DONE. */
  public static void main(String[] args) {
    WordCountOptions options =
        PipelineOptionsFactory.fromArgs(args).withValidation().as(WordCountOptions.class);
    Pipeline p = Pipeline.create(options);
    build(p, options);
    PipelineResult result = p.run();
    PipelineResult.State state;
    try {
      state = result.waitUntilFinish();
    } catch (Pipeline.PipelineExecutionException e) {
      // A FAILED job (WeirRunner's waitUntilFinish throws, with the job's errors).
      state = result.getState();
    }
    System.out.println("state " + state);
    result
        .metrics()
        .allMetrics()
        .getCounters()
        .forEach(c -> System.out.println("metric " + c.getName().getName() + " " + c.getAttempted()));
    result
        .metrics()
        .allMetrics()
        .getDistributions()
        .forEach(
            d ->
                System.out.println(
                    "metric "
                        + d.getName().getName()
                        + " "
                        + d.getAttempted().getCount()
                        + "/"
                        + d.getAttempted().getSum()));
    if (state != PipelineResult.State.DONE) {
      if (result instanceof dev.weir.runner.WeirPipelineResult) {
        ((dev.weir.runner.WeirPipelineResult) result).getProblems().forEach(System.err::println);
      }
      System.exit(1);
    }
  }
}
