package dev.weir.runner;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertFalse;
import static org.junit.Assert.assertTrue;

import java.beans.Introspector;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import java.util.stream.Collectors;
import org.apache.beam.sdk.options.PipelineOptions;
import org.apache.beam.sdk.options.PipelineOptionsFactory;
import org.apache.beam.sdk.options.Validation;
import org.apache.beam.sdk.util.construction.PipelineOptionsTranslation;
import org.apache.beam.vendor.grpc.v1p69p0.com.google.protobuf.Struct;
import org.apache.beam.vendor.grpc.v1p69p0.com.google.protobuf.Value;
import org.junit.Test;

/**
 * Dataflow's options parse with Weir's jar alone ({@link DataflowCompatibleOptions}) and reach the
 * Job API under the portable names Weir reads; docs/pipeline-options.md names no Java option that
 * no interface declares.
 */
public class DataflowCompatibleOptionsTest {

  /** A flag for each option of the two interfaces: flag, portable key, value in the Struct. */
  private static final List<Object[]> CASES =
      List.of(
          c("--region=europe-west1", "beam:option:region:v1", "europe-west1"),
          c("--stagingLocation=/tmp/stage", "beam:option:staging_location:v1", "/tmp/stage"),
          c("--labels={\"team\":\"data\"}", "beam:option:labels:v1", Map.of("team", "data")),
          c(
              "--dataflowServiceOptions=enable_prime,min_num_workers=2",
              "beam:option:dataflow_service_options:v1",
              List.of("enable_prime", "min_num_workers=2")),
          c("--serviceAccount=sa@p.iam", "beam:option:service_account:v1", "sa@p.iam"),
          c(
              "--dataflowEndpoint=https://df.example/",
              "beam:option:dataflow_endpoint:v1",
              "https://df.example/"),
          c("--templateLocation=gs://b/t", "beam:option:template_location:v1", "gs://b/t"),
          c("--update=true", "beam:option:update:v1", true),
          c("--createFromSnapshot=snap-1", "beam:option:create_from_snapshot:v1", "snap-1"),
          c(
              "--transformNameMapping={\"Old\":\"New\"}",
              "beam:option:transform_name_mapping:v1",
              Map.of("Old", "New")),
          c("--dataflowWorkerJar=/tmp/w.jar", "beam:option:dataflow_worker_jar:v1", "/tmp/w.jar"),
          c("--flexRSGoal=COST_OPTIMIZED", "beam:option:flex_r_s_goal:v1", "COST_OPTIMIZED"),
          c("--numWorkers=2", "beam:option:num_workers:v1", 2.0),
          c("--maxNumWorkers=5", "beam:option:max_num_workers:v1", 5.0),
          c(
              "--autoscalingAlgorithm=THROUGHPUT_BASED",
              "beam:option:autoscaling_algorithm:v1",
              "THROUGHPUT_BASED"),
          c("--diskSizeGb=50", "beam:option:disk_size_gb:v1", 50.0),
          c("--workerMachineType=e2-small", "beam:option:worker_machine_type:v1", "e2-small"),
          c("--workerDiskType=pd-ssd", "beam:option:worker_disk_type:v1", "pd-ssd"),
          c("--network=default", "beam:option:network:v1", "default"),
          c("--subnetwork=subnetworks/s", "beam:option:subnetwork:v1", "subnetworks/s"),
          c("--usePublicIps=false", "beam:option:use_public_ips:v1", false),
          c("--minCpuPlatform=Intel Skylake", "beam:option:min_cpu_platform:v1", "Intel Skylake"),
          c("--sdkContainerImage=img:1", "beam:option:sdk_container_image:v1", "img:1"),
          c(
              "--workerHarnessContainerImage=img:2",
              "beam:option:worker_harness_container_image:v1",
              "img:2"),
          c("--hotKeyLoggingEnabled=true", "beam:option:hot_key_logging_enabled:v1", true),
          c("--dumpHeapOnOOM=true", "beam:option:dump_heap_on_o_o_m:v1", true),
          c(
              "--saveHeapDumpsToGcsPath=gs://b/h",
              "beam:option:save_heap_dumps_to_gcs_path:v1",
              "gs://b/h"),
          c(
              "--sdkHarnessContainerImageOverrides=.*java.*,img:3",
              "beam:option:sdk_harness_container_image_overrides:v1",
              ".*java.*,img:3"),
          c("--saveProfilesToGcs=gs://b/p", "beam:option:save_profiles_to_gcs:v1", "gs://b/p"),
          c(
              "--profilingAgentConfiguration={\"APICurated\":true}",
              "beam:option:profiling_agent_configuration:v1",
              Map.of("APICurated", true)),
          c("--defaultWorkerLogLevel=DEBUG", "beam:option:default_worker_log_level:v1", "DEBUG"),
          c(
              "--workerLogLevelOverrides={\"org.apache\":\"WARN\"}",
              "beam:option:worker_log_level_overrides:v1",
              Map.of("org.apache", "WARN")),
          // DataflowCompatibleOptions.Gcp
          c("--project=my-project", "beam:option:project:v1", "my-project"),
          c("--zone=europe-west1-b", "beam:option:zone:v1", "europe-west1-b"),
          c("--workerRegion=europe-west1", "beam:option:worker_region:v1", "europe-west1"),
          c("--workerZone=europe-west1-c", "beam:option:worker_zone:v1", "europe-west1-c"),
          c("--gcpTempLocation=gs://b/tmp", "beam:option:gcp_temp_location:v1", "gs://b/tmp"),
          c(
              "--gcpOauthScopes=https://s/a,https://s/b",
              "beam:option:gcp_oauth_scopes:v1",
              List.of("https://s/a", "https://s/b")),
          c(
              "--impersonateServiceAccount=a@p.iam,b@p.iam",
              "beam:option:impersonate_service_account:v1",
              "a@p.iam,b@p.iam"),
          c("--enableStreamingEngine=true", "beam:option:enable_streaming_engine:v1", true),
          c("--dataflowKmsKey=projects/p/k", "beam:option:dataflow_kms_key:v1", "projects/p/k"));

  private static Object[] c(String flag, String key, Object value) {
    return new Object[] {flag, key, value};
  }

  private static String optionName(String flag) {
    return flag.substring(2, flag.indexOf('='));
  }

  /** The option names an interface declares itself (or, with {@code inherited}, also inherits). */
  private static Set<String> declared(Class<?> iface, boolean inherited) {
    Set<String> names = new TreeSet<>();
    for (Method m : inherited ? iface.getMethods() : iface.getDeclaredMethods()) {
      String n = m.getName();
      int prefix = n.startsWith("get") ? 3 : n.startsWith("is") ? 2 : 0;
      if (prefix > 0 && n.length() > prefix && m.getParameterCount() == 0) {
        names.add(Introspector.decapitalize(n.substring(prefix)));
      }
    }
    return names;
  }

  /** A Struct value as Java: Double, String, Boolean, List or Map. */
  private static Object plain(Value v) {
    switch (v.getKindCase()) {
      case NUMBER_VALUE:
        return v.getNumberValue();
      case STRING_VALUE:
        return v.getStringValue();
      case BOOL_VALUE:
        return v.getBoolValue();
      case LIST_VALUE:
        return v.getListValue().getValuesList().stream()
            .map(DataflowCompatibleOptionsTest::plain)
            .collect(Collectors.toList());
      case STRUCT_VALUE:
        Map<String, Object> m = new LinkedHashMap<>();
        v.getStructValue().getFieldsMap().forEach((k, x) -> m.put(k, plain(x)));
        return m;
      default:
        return null;
    }
  }

  @Test
  public void casesCoverEveryDeclaredOption() {
    Set<String> declared = new TreeSet<>(declared(DataflowCompatibleOptions.class, false));
    declared.addAll(declared(DataflowCompatibleOptions.Gcp.class, false));
    Set<String> tested = new TreeSet<>();
    for (Object[] c : CASES) {
      tested.add(optionName((String) c[0]));
    }
    assertEquals(declared, tested);
  }

  @Test
  public void everyOptionReachesTheJobApiUnderItsPortableName() {
    for (Object[] c : CASES) {
      PipelineOptions options =
          PipelineOptionsFactory.fromArgs((String) c[0]).as(PipelineOptions.class);
      Struct proto = PipelineOptionsTranslation.toProto(options);
      Value value = proto.getFieldsMap().get((String) c[1]);
      assertTrue(c[0] + ": no " + c[1] + " in " + proto.getFieldsMap().keySet(), value != null);
      assertEquals((String) c[0], c[2], plain(value));
    }
  }

  @Test
  public void unsetOptionsAreNotSent() {
    PipelineOptions options =
        PipelineOptionsFactory.fromArgs("--runner=WeirRunner").as(PipelineOptions.class);
    Set<String> keys = PipelineOptionsTranslation.toProto(options).getFieldsMap().keySet();
    for (Object[] c : CASES) {
      assertFalse(c[1] + " sent without its flag", keys.contains((String) c[1]));
    }
    // An object getter read while unset binds null, which Weir counts as not set.
    assertEquals(null, options.as(DataflowCompatibleOptions.class).getLabels());
    Struct proto = PipelineOptionsTranslation.toProto(options);
    assertEquals(
        Value.KindCase.NULL_VALUE, proto.getFieldsMap().get("beam:option:labels:v1").getKindCase());
  }

  /** A pipeline's own options, as WordCount has them. */
  public interface UserOptions extends PipelineOptions {
    @Validation.Required
    String getInputFile();

    void setInputFile(String value);
  }

  @Test
  public void userOptionsAcceptDataflowFlagsWithValidation() {
    UserOptions options =
        PipelineOptionsFactory.fromArgs(
                "--inputFile=in.txt",
                "--runner=WeirRunner",
                "--numWorkers=2",
                "--maxNumWorkers=3",
                "--autoscalingAlgorithm=THROUGHPUT_BASED",
                "--labels={\"team\":\"data\"}",
                "--region=europe-west1")
            .withValidation()
            .as(UserOptions.class);
    DataflowCompatibleOptions dataflow = options.as(DataflowCompatibleOptions.class);
    assertEquals(2, dataflow.getNumWorkers());
    assertEquals(3, dataflow.getMaxNumWorkers());
    assertEquals("THROUGHPUT_BASED", dataflow.getAutoscalingAlgorithm());
    assertEquals(Map.of("team", "data"), dataflow.getLabels());
    assertEquals("europe-west1", dataflow.getRegion());
  }

  /** The backticked names in the Java column of docs/pipeline-options.md's option tables. */
  private static Set<String> documentedJavaOptions() throws Exception {
    Path doc = Path.of("..", "docs", "pipeline-options.md");
    Set<String> names = new TreeSet<>();
    boolean inTable = false;
    Pattern code = Pattern.compile("`([^`]+)`");
    for (String line : Files.readAllLines(doc, StandardCharsets.UTF_8)) {
      if (!line.startsWith("|")) {
        inTable = false;
        continue;
      }
      String[] cells = line.split("\\|", -1);
      if (cells.length > 2 && cells[2].trim().equals("Java")) {
        inTable = cells[1].trim().equals("Python / YAML");
        continue;
      }
      String java = cells.length > 2 ? cells[2].trim() : "";
      if (!inTable || java.isEmpty() || java.equals("—") || java.startsWith("---")) {
        continue;
      }
      Matcher m = code.matcher(java);
      while (m.find()) {
        names.add(m.group(1));
      }
    }
    return names;
  }

  @Test
  public void documentedJavaOptionsAreAllDeclared() throws Exception {
    Set<String> documented = documentedJavaOptions();
    assertTrue("only " + documented, documented.size() > 40);
    assertTrue(documented.containsAll(List.of("numWorkers", "flexRSGoal", "gcpTempLocation")));
    Set<String> declared = new TreeSet<>();
    for (Class<? extends PipelineOptions> iface : PipelineOptionsFactory.getRegisteredOptions()) {
      declared.addAll(declared(iface, true));
    }
    List<String> missing = new ArrayList<>(documented);
    missing.removeAll(declared);
    assertEquals("documented but declared by no registered interface", List.of(), missing);

    // And the other way: this module declares no Dataflow option the docs do not list.
    List<String> undocumented = new ArrayList<>(declared(DataflowCompatibleOptions.class, false));
    undocumented.addAll(declared(DataflowCompatibleOptions.Gcp.class, false));
    undocumented.removeAll(documented);
    assertEquals("declared but not in docs/pipeline-options.md", List.of(), undocumented);
  }

  @Test
  public void registrarLeavesDataflowOptionsToDataflowsOwnJars() {
    assertTrue(
        PipelineOptionsFactory.getRegisteredOptions()
            .containsAll(
                List.of(DataflowCompatibleOptions.class, DataflowCompatibleOptions.Gcp.class)));
    assertEquals(
        List.of(
            WeirPipelineOptions.class,
            DataflowCompatibleOptions.class,
            DataflowCompatibleOptions.Gcp.class),
        WeirRunnerRegistrar.Options.options(name -> false));
    assertEquals(
        List.of(WeirPipelineOptions.class, DataflowCompatibleOptions.class),
        WeirRunnerRegistrar.Options.options(WeirRunnerRegistrar.Options.GCP_OPTIONS::equals));
    assertEquals(
        List.of(WeirPipelineOptions.class),
        WeirRunnerRegistrar.Options.options(name -> true));
  }
}
