package dev.weir.runner;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertNull;

import java.util.List;
import java.util.Map;
import org.apache.beam.model.jobmanagement.v1.JobApi;
import org.apache.beam.model.pipeline.v1.MetricsApi.MonitoringInfo;
import org.apache.beam.sdk.metrics.DistributionResult;
import org.apache.beam.sdk.metrics.MetricNameFilter;
import org.apache.beam.sdk.metrics.MetricQueryResults;
import org.apache.beam.sdk.metrics.MetricResult;
import org.apache.beam.sdk.metrics.MetricsFilter;
import org.apache.beam.vendor.grpc.v1p69p0.com.google.protobuf.ByteString;
import org.junit.Test;

/** {@link WeirMetrics} reads the user metrics of a GetJobMetrics answer, byte for byte. */
public class WeirMetricsTest {

  private static MonitoringInfo info(String urn, String step, String name, int... payload) {
    byte[] bytes = new byte[payload.length];
    for (int i = 0; i < payload.length; i++) {
      bytes[i] = (byte) payload[i];
    }
    MonitoringInfo.Builder b =
        MonitoringInfo.newBuilder()
            .setUrn(urn)
            .setPayload(ByteString.copyFrom(bytes))
            .putLabels("NAMESPACE", "ns")
            .putLabels("NAME", name);
    if (step != null) {
      b.putLabels("PTRANSFORM", step);
    }
    return b.build();
  }

  @Test
  public void countersAndDistributionsKeepStepAttemptedAndCommitted() {
    JobApi.MetricResults proto =
        JobApi.MetricResults.newBuilder()
            // varint 300 = ac 02
            .addAttempted(info("beam:metric:user:sum_int64:v1", "ParDo(A)", "count", 0xac, 0x02))
            .addCommitted(info("beam:metric:user:sum_int64:v1", "ParDo(A)", "count", 0x07))
            // count 3, sum 10, min 1, max 6
            .addAttempted(
                info("beam:metric:user:distribution_int64:v1", "ParDo(B)", "len", 3, 10, 1, 6))
            // Not a user metric: left out.
            .addAttempted(
                MonitoringInfo.newBuilder()
                    .setUrn("beam:metric:element_count:v1")
                    .setPayload(ByteString.copyFrom(new byte[] {5}))
                    .putLabels("PCOLLECTION", "pc")
                    .build())
            .build();
    MetricQueryResults all = new WeirMetrics(proto).allMetrics();

    List<MetricResult<Long>> counters = (List<MetricResult<Long>>) all.getCounters();
    assertEquals(1, counters.size());
    assertEquals("ParDo(A)", counters.get(0).getKey().stepName());
    assertEquals("count", counters.get(0).getName().getName());
    assertEquals(Long.valueOf(300), counters.get(0).getAttempted());
    assertEquals(Long.valueOf(7), counters.get(0).getCommitted());

    List<MetricResult<DistributionResult>> dists =
        (List<MetricResult<DistributionResult>>) all.getDistributions();
    assertEquals(1, dists.size());
    assertEquals(DistributionResult.create(10, 3, 1, 6), dists.get(0).getAttempted());
  }

  @Test
  public void filtersByNameAndStep() {
    JobApi.MetricResults proto =
        JobApi.MetricResults.newBuilder()
            .addAttempted(info("beam:metric:user:sum_int64:v1", "Outer/ParDo(A)", "a", 1))
            .addAttempted(info("beam:metric:user:sum_int64:v1", "Outer/ParDo(B)", "b", 2))
            .addAttempted(info("beam:metric:user:sum_int64:v1", null, "a", 3))
            .build();
    WeirMetrics metrics = new WeirMetrics(proto);
    List<MetricResult<Long>> byName =
        (List<MetricResult<Long>>)
            metrics
                .queryMetrics(
                    MetricsFilter.builder().addNameFilter(MetricNameFilter.named("ns", "a")).build())
                .getCounters();
    assertEquals(2, byName.size());
    List<MetricResult<Long>> byStep =
        (List<MetricResult<Long>>)
            metrics.queryMetrics(MetricsFilter.builder().addStep("ParDo(B)").build()).getCounters();
    assertEquals(1, byStep.size());
    assertEquals(Long.valueOf(2), byStep.get(0).getAttempted());
    // No committed value in the proto: none reported.
    assertNull(byStep.get(0).getCommittedOrNull());
  }

  @Test
  public void stepsAreTheTransformsUniqueNames() {
    Map<String, String> names =
        Map.of(
            "Analyze-ParMultiDo-Anonymous-", "Analyze/ParMultiDo(Anonymous)",
            "Read-ParMultiDo-Sdf-", "Read/ParMultiDo(Sdf)");
    JobApi.MetricResults proto =
        JobApi.MetricResults.newBuilder()
            .addAttempted(
                info("beam:metric:user:sum_int64:v1", "Analyze-ParMultiDo-Anonymous-", "a", 5))
            .addCommitted(
                info("beam:metric:user:sum_int64:v1", "Analyze-ParMultiDo-Anonymous-", "a", 4))
            // A transform Weir added counts as the one it stands for; its metric stays apart.
            .addAttempted(
                info("beam:metric:user:sum_int64:v1", "Read-ParMultiDo-Sdf-/weir:sdf-process", "r", 6))
            .addAttempted(info("beam:metric:user:sum_int64:v1", "Read-ParMultiDo-Sdf-", "r", 1))
            // Unknown to the pipeline: the id stays.
            .addAttempted(info("beam:metric:user:sum_int64:v1", "other", "o", 2))
            .build();
    WeirMetrics metrics = new WeirMetrics(proto, names);
    List<MetricResult<Long>> analyze =
        (List<MetricResult<Long>>)
            metrics.queryMetrics(MetricsFilter.builder().addStep("Analyze").build()).getCounters();
    assertEquals(1, analyze.size());
    assertEquals("Analyze/ParMultiDo(Anonymous)", analyze.get(0).getKey().stepName());
    assertEquals(Long.valueOf(5), analyze.get(0).getAttempted());
    assertEquals(Long.valueOf(4), analyze.get(0).getCommitted());
    List<MetricResult<Long>> read =
        (List<MetricResult<Long>>)
            metrics.queryMetrics(MetricsFilter.builder().addStep("Read").build()).getCounters();
    assertEquals(2, read.size());
    assertEquals("Read/ParMultiDo(Sdf)", read.get(0).getKey().stepName());
    assertEquals("Read/ParMultiDo(Sdf)", read.get(1).getKey().stepName());
    assertEquals(7, read.get(0).getAttempted() + read.get(1).getAttempted());
    List<MetricResult<Long>> other =
        (List<MetricResult<Long>>)
            metrics.queryMetrics(MetricsFilter.builder().addStep("other").build()).getCounters();
    assertEquals("other", other.get(0).getKey().stepName());
  }
}
