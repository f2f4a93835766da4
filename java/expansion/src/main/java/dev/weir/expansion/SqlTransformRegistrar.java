package dev.weir.expansion;

import java.util.Collections;
import java.util.Map;
import org.apache.beam.sdk.expansion.ExternalTransformRegistrar;
import org.apache.beam.sdk.extensions.sql.SqlTransform;
import org.apache.beam.sdk.transforms.ExternalTransformBuilder;
import org.apache.beam.sdk.transforms.PTransform;
import org.apache.beam.sdk.values.PCollection;
import org.apache.beam.sdk.values.PInput;
import org.apache.beam.sdk.values.Row;

/**
 * Registers Beam SQL's cross-language transform, URN {@code beam:external:java:sql:v1} (what
 * Python's {@code apache_beam.transforms.sql.SqlTransform} asks for), with Beam's Java expansion
 * service.
 *
 * <p>Beam ships this registration in {@code beam-sdks-java-extensions-sql-expansion-service},
 * which Maven Central does not serve here at any version that matches the other 2.73.0 modules;
 * {@code beam-sdks-java-extensions-sql} itself resolves at 2.71.0 and runs on Beam core 2.73.0.
 * The payload is an {@code ExternalConfigurationPayload} row with the fields {@code query}
 * (string), {@code dialect} (optional string) and {@code ddl} (optional string), as Python sends
 * them.
 */
public class SqlTransformRegistrar implements ExternalTransformRegistrar {
  /** The URN of Python's SqlTransform. */
  public static final String URN = "beam:external:java:sql:v1";

  @Override
  public Map<String, ExternalTransformBuilder<?, ?, ?>> knownBuilderInstances() {
    return Collections.singletonMap(URN, new Builder());
  }

  /** The transform's configuration, filled from the payload row by its setters. */
  public static class Configuration {
    private String query = "";
    private String dialect;
    private String ddl;

    public void setQuery(String query) {
      this.query = query;
    }

    public void setDialect(String dialect) {
      this.dialect = dialect;
    }

    public void setDdl(String ddl) {
      this.ddl = ddl;
    }
  }

  /** Builds {@code SqlTransform.query(query)} (Calcite's planner), with the DDL when given. */
  public static class Builder
      implements ExternalTransformBuilder<Configuration, PInput, PCollection<Row>> {
    @Override
    public PTransform<PInput, PCollection<Row>> buildExternal(Configuration configuration) {
      if (configuration.dialect != null
          && !configuration.dialect.isEmpty()
          && !configuration.dialect.equalsIgnoreCase("calcite")) {
        throw new IllegalArgumentException(
            "SqlTransform ("
                + URN
                + "): dialect '"
                + configuration.dialect
                + "' is not available in this expansion service; only 'calcite' is");
      }
      SqlTransform transform = SqlTransform.query(configuration.query);
      if (configuration.ddl != null && !configuration.ddl.isEmpty()) {
        transform = transform.withDdlString(configuration.ddl);
      }
      return transform;
    }
  }
}
