package dev.weir.examples;

import org.apache.beam.sdk.Pipeline;
import org.apache.beam.sdk.PipelineResult;
import org.apache.beam.sdk.coders.VarIntCoder;
import org.apache.beam.sdk.io.TextIO;
import org.apache.beam.sdk.options.Description;
import org.apache.beam.sdk.options.PipelineOptions;
import org.apache.beam.sdk.options.PipelineOptionsFactory;
import org.apache.beam.sdk.options.Validation;
import org.apache.beam.sdk.state.StateSpec;
import org.apache.beam.sdk.state.StateSpecs;
import org.apache.beam.sdk.state.TimeDomain;
import org.apache.beam.sdk.state.Timer;
import org.apache.beam.sdk.state.TimerSpec;
import org.apache.beam.sdk.state.TimerSpecs;
import org.apache.beam.sdk.state.ValueState;
import org.apache.beam.sdk.transforms.Create;
import org.apache.beam.sdk.transforms.DoFn;
import org.apache.beam.sdk.transforms.Flatten;
import org.apache.beam.sdk.transforms.GroupByKey;
import org.apache.beam.sdk.transforms.ParDo;
import org.apache.beam.sdk.transforms.WithTimestamps;
import org.apache.beam.sdk.transforms.windowing.BoundedWindow;
import org.apache.beam.sdk.transforms.windowing.FixedWindows;
import org.apache.beam.sdk.transforms.windowing.GlobalWindow;
import org.apache.beam.sdk.transforms.windowing.GlobalWindows;
import org.apache.beam.sdk.transforms.windowing.IntervalWindow;
import org.apache.beam.sdk.transforms.windowing.Window;
import org.apache.beam.sdk.values.KV;
import org.apache.beam.sdk.values.PCollection;
import org.apache.beam.sdk.values.PCollectionList;
import org.joda.time.Duration;
import org.joda.time.Instant;

/**
 * Timer order and global-window timestamps, for the end-to-end test that compares Weir with
 * Java's DirectRunner. Per key and hourly window, a {@code tick} timer fires every 10 minutes
 * from the window's start and re-arms itself, and an {@code aWindowEnd} timer (a family whose
 * name sorts first) fires at the window's end and writes how many ticks ran before it: Beam
 * fires a key's timers in timestamp order, so 5. A GroupByKey in the global window writes
 * whether its output is stamped at {@link GlobalWindow#maxTimestamp()}. Lines go to files
 * starting with {@code --output}.
 */
public final class TimerOrder {
  private TimerOrder() {}

  /** Counts the ticks of a window before its end-of-window timer fires. */
  static final class TicksFn extends DoFn<KV<String, Integer>, String> {
    @StateId("ticks")
    private final StateSpec<ValueState<Integer>> ticksSpec = StateSpecs.value(VarIntCoder.of());

    @TimerId("aWindowEnd")
    private final TimerSpec windowEndSpec = TimerSpecs.timer(TimeDomain.EVENT_TIME);

    @TimerId("tick")
    private final TimerSpec tickSpec = TimerSpecs.timer(TimeDomain.EVENT_TIME);

    @ProcessElement
    public void process(
        BoundedWindow window,
        @TimerId("aWindowEnd") Timer windowEnd,
        @TimerId("tick") Timer tick) {
      IntervalWindow w = (IntervalWindow) window;
      windowEnd.set(w.maxTimestamp());
      tick.set(w.start().plus(Duration.standardMinutes(10)));
    }

    @OnTimer("tick")
    public void onTick(
        OnTimerContext c,
        @StateId("ticks") ValueState<Integer> ticks,
        @TimerId("tick") Timer tick) {
      Integer n = ticks.read();
      ticks.write(n == null ? 1 : n + 1);
      Instant next = c.timestamp().plus(Duration.standardMinutes(10));
      if (next.isBefore(((IntervalWindow) c.window()).end())) {
        tick.set(next);
      }
    }

    @OnTimer("aWindowEnd")
    public void onWindowEnd(
        OnTimerContext c,
        @Key String key,
        @StateId("ticks") ValueState<Integer> ticks,
        OutputReceiver<String> out) {
      Integer n = ticks.read();
      out.output(key + " " + c.window() + " ticks before the window's end: " + (n == null ? 0 : n));
    }
  }

  /** Options: where the lines go. */
  public interface Options extends PipelineOptions {
    @Description("Prefix of the output files")
    @Validation.Required
    String getOutput();

    void setOutput(String value);
  }

  public static void main(String[] args) {
    Options options = PipelineOptionsFactory.fromArgs(args).withValidation().as(Options.class);
    Pipeline p = Pipeline.create(options);
    PCollection<KV<String, Integer>> input =
        p.apply(Create.of(KV.of("a", 1), KV.of("a", 2), KV.of("b", 3), KV.of("b", 4)))
            .apply(
                WithTimestamps.of(
                    (KV<String, Integer> kv) ->
                        new Instant(0).plus(Duration.standardMinutes(70L * kv.getValue()))));
    PCollection<String> ticks =
        input
            .apply(Window.into(FixedWindows.of(Duration.standardHours(1))))
            .apply(ParDo.of(new TicksFn()))
            .apply("Rewindow", Window.into(new GlobalWindows()));
    PCollection<String> globalStamps =
        input
            .apply(GroupByKey.create())
            .apply(
                ParDo.of(
                    new DoFn<KV<String, Iterable<Integer>>, String>() {
                      @ProcessElement
                      public void process(
                          @Element KV<String, Iterable<Integer>> kv,
                          @Timestamp Instant ts,
                          OutputReceiver<String> out) {
                        out.output(
                            kv.getKey()
                                + " grouped at the global window's max timestamp: "
                                + ts.equals(GlobalWindow.INSTANCE.maxTimestamp()));
                      }
                    }));
    PCollectionList.of(ticks)
        .and(globalStamps)
        .apply(Flatten.pCollections())
        .apply(TextIO.write().to(options.getOutput()));
    PipelineResult.State state = p.run().waitUntilFinish();
    System.out.println("state " + state);
    if (state != PipelineResult.State.DONE) {
      System.exit(1);
    }
  }
}
