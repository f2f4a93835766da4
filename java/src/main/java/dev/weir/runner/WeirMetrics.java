package dev.weir.runner;

import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.function.Function;
import org.apache.beam.model.jobmanagement.v1.JobApi;
import org.apache.beam.model.pipeline.v1.MetricsApi.MonitoringInfo;
import org.apache.beam.runners.core.metrics.MonitoringInfoConstants;
import org.apache.beam.runners.core.metrics.MonitoringInfoEncodings;
import org.apache.beam.sdk.metrics.BoundedTrieResult;
import org.apache.beam.sdk.metrics.DistributionResult;
import org.apache.beam.sdk.metrics.GaugeResult;
import org.apache.beam.sdk.metrics.MetricFiltering;
import org.apache.beam.sdk.metrics.MetricKey;
import org.apache.beam.sdk.metrics.MetricName;
import org.apache.beam.sdk.metrics.MetricQueryResults;
import org.apache.beam.sdk.metrics.MetricResult;
import org.apache.beam.sdk.metrics.MetricResults;
import org.apache.beam.sdk.metrics.MetricsFilter;
import org.apache.beam.sdk.metrics.StringSetResult;
import org.apache.beam.vendor.grpc.v1p69p0.com.google.protobuf.ByteString;
import org.checkerframework.checker.nullness.qual.Nullable;

/**
 * The user metrics of a job, from the Job API's {@code GetJobMetrics} answer: each
 * {@code MonitoringInfo} with a user-metric URN ({@code beam:metric:user:sum_int64:v1},
 * {@code distribution_int64}, {@code latest_int64}, {@code set_string}, {@code bounded_trie})
 * and the labels {@code PTRANSFORM}, {@code NAMESPACE}, {@code NAME} becomes one {@link
 * MetricResult} keyed by step and name. The step is the transform's unique name in the submitted
 * pipeline ({@code Outer/ParMultiDo(Fn)}, as DirectRunner names steps), not its id; a transform
 * Weir added ({@code <id>/weir:...}) counts as the transform it stands for. Attempted and committed values are matched by URN and
 * labels; a metric without a committed value reports none. Other monitoring infos (element
 * counts, msecs) are not user metrics and are left out.
 */
public final class WeirMetrics extends MetricResults {
  private final Map<Key, Entry> entries = new LinkedHashMap<>();

  /**
   * A metric's identity in the proto: URN, the PTRANSFORM label as sent (two transform ids may
   * have one step name: their metrics stay apart) and the {@link MetricKey} reported (step name,
   * namespace, name).
   */
  private record Key(String urn, String transformId, MetricKey metricKey) {}

  private static final class Entry {
    @Nullable MonitoringInfo attempted;
    @Nullable MonitoringInfo committed;
  }

  /** Builds the results of one {@code GetJobMetricsResponse.metrics}, steps named by their ids. */
  public WeirMetrics(JobApi.MetricResults proto) {
    this(proto, Map.of());
  }

  /**
   * Builds the results of one {@code GetJobMetricsResponse.metrics}.
   *
   * @param transformNames the unique name of each transform id of the submitted pipeline
   */
  public WeirMetrics(JobApi.MetricResults proto, Map<String, String> transformNames) {
    for (MonitoringInfo info : proto.getAttemptedList()) {
      Key key = key(info, transformNames);
      if (key != null) {
        entries.computeIfAbsent(key, k -> new Entry()).attempted = info;
      }
    }
    for (MonitoringInfo info : proto.getCommittedList()) {
      Key key = key(info, transformNames);
      if (key != null) {
        entries.computeIfAbsent(key, k -> new Entry()).committed = info;
      }
    }
  }

  /** Results of a job whose metrics could not be fetched: every query answers nothing. */
  public static WeirMetrics empty() {
    return new WeirMetrics(JobApi.MetricResults.getDefaultInstance());
  }

  /**
   * The step name of transform {@code id}: its unique name, or for a transform Weir added to the
   * pipeline ({@code <id>/weir:...}) the unique name of {@code <id>}; else {@code id} itself.
   */
  static String stepName(String id, Map<String, String> transformNames) {
    String name = transformNames.get(id);
    if (name != null) {
      return name;
    }
    int weir = id.indexOf("/weir:");
    if (weir > 0) {
      name = transformNames.get(id.substring(0, weir));
      if (name != null) {
        return name;
      }
    }
    return id;
  }

  private static @Nullable Key key(MonitoringInfo info, Map<String, String> transformNames) {
    String namespace = info.getLabelsMap().get(MonitoringInfoConstants.Labels.NAMESPACE);
    String name = info.getLabelsMap().get(MonitoringInfoConstants.Labels.NAME);
    if (namespace == null || name == null || !info.getUrn().startsWith("beam:metric:user:")) {
      return null;
    }
    String id = info.getLabelsMap().getOrDefault(MonitoringInfoConstants.Labels.PTRANSFORM, "");
    return new Key(
        info.getUrn(),
        id,
        MetricKey.create(stepName(id, transformNames), MetricName.named(namespace, name)));
  }

  private <T> List<MetricResult<T>> select(
      MetricsFilter filter, String urn, Function<ByteString, T> decode) {
    List<MetricResult<T>> out = new ArrayList<>();
    for (Map.Entry<Key, Entry> e : entries.entrySet()) {
      Key key = e.getKey();
      if (!key.urn().equals(urn) || !MetricFiltering.matches(filter, key.metricKey())) {
        continue;
      }
      Entry entry = e.getValue();
      T committed = entry.committed == null ? null : decode.apply(entry.committed.getPayload());
      T attempted =
          entry.attempted == null ? committed : decode.apply(entry.attempted.getPayload());
      if (attempted == null) {
        continue;
      }
      out.add(MetricResult.create(key.metricKey(), committed, attempted));
    }
    return out;
  }

  @Override
  public MetricQueryResults queryMetrics(@Nullable MetricsFilter filter) {
    MetricsFilter f = filter == null ? MetricsFilter.builder().build() : filter;
    List<MetricResult<Long>> counters =
        select(
            f,
            MonitoringInfoConstants.Urns.USER_SUM_INT64,
            MonitoringInfoEncodings::decodeInt64Counter);
    List<MetricResult<DistributionResult>> distributions =
        select(
            f,
            MonitoringInfoConstants.Urns.USER_DISTRIBUTION_INT64,
            p -> MonitoringInfoEncodings.decodeInt64Distribution(p).extractResult());
    List<MetricResult<GaugeResult>> gauges =
        select(
            f,
            MonitoringInfoConstants.Urns.USER_LATEST_INT64,
            p -> MonitoringInfoEncodings.decodeInt64Gauge(p).extractResult());
    List<MetricResult<StringSetResult>> stringSets =
        select(
            f,
            MonitoringInfoConstants.Urns.USER_SET_STRING,
            p -> MonitoringInfoEncodings.decodeStringSet(p).extractResult());
    List<MetricResult<BoundedTrieResult>> boundedTries =
        select(
            f,
            MonitoringInfoConstants.Urns.USER_BOUNDED_TRIE,
            p -> MonitoringInfoEncodings.decodeBoundedTrie(p).extractResult());
    return MetricQueryResults.create(
        counters, distributions, gauges, stringSets, boundedTries, List.of());
  }
}
