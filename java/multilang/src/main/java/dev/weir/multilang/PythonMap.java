package dev.weir.multilang;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.util.Arrays;
import org.apache.beam.model.pipeline.v1.ExternalTransforms.ExternalConfigurationPayload;
import org.apache.beam.sdk.Pipeline;
import org.apache.beam.sdk.coders.RowCoder;
import org.apache.beam.sdk.coders.StringUtf8Coder;
import org.apache.beam.sdk.io.TextIO;
import org.apache.beam.sdk.options.Description;
import org.apache.beam.sdk.options.PipelineOptions;
import org.apache.beam.sdk.options.PipelineOptionsFactory;
import org.apache.beam.sdk.options.Validation;
import org.apache.beam.sdk.schemas.Schema;
import org.apache.beam.sdk.schemas.SchemaTranslation;
import org.apache.beam.sdk.transforms.Create;
import org.apache.beam.sdk.util.construction.External;
import org.apache.beam.sdk.values.PCollection;
import org.apache.beam.sdk.values.Row;

/**
 * A Java pipeline with a Python step: the strings {@code --words} (comma-separated) go through
 * the Python transform function {@code --pythonFn} (Python source of a callable taking and
 * returning a PCollection), expanded by Python's expansion service at {@code --expansionService}
 * as {@code beam:transforms:python:fully_qualified_named} with constructor {@code __callable__}
 * (what Beam's {@code PythonExternalTransform.from("__callable__")} sends), and Java's TextIO
 * writes the results to {@code --output} (one file). Strings cross between the Java and Python
 * environments as {@code beam:coder:string_utf8:v1}.
 */
public class PythonMap {
  /** The URN of Python's expansion of a named or given callable. */
  public static final String URN = "beam:transforms:python:fully_qualified_named";

  /** Options of {@link PythonMap}. */
  public interface Options extends PipelineOptions {
    @Description("host:port of Python's expansion service")
    @Validation.Required
    String getExpansionService();

    void setExpansionService(String value);

    @Description("Comma-separated input strings")
    @Validation.Required
    String getWords();

    void setWords(String value);

    @Description("Python source of a function from PCollection to PCollection")
    @Validation.Required
    String getPythonFn();

    void setPythonFn(String value);

    @Description("Output file")
    @Validation.Required
    String getOutput();

    void setOutput(String value);
  }

  /** The ExternalConfigurationPayload row {constructor, args: {arg0: source}, kwargs: {}}. */
  static byte[] payload(String pythonSource) throws IOException {
    Schema args = Schema.builder().addStringField("arg0").build();
    Schema kwargs = Schema.builder().build();
    Schema schema =
        Schema.builder()
            .addStringField("constructor")
            .addRowField("args", args)
            .addRowField("kwargs", kwargs)
            .build();
    Row row =
        Row.withSchema(schema)
            .addValues(
                "__callable__",
                Row.withSchema(args).addValue(pythonSource).build(),
                Row.withSchema(kwargs).build())
            .build();
    ByteArrayOutputStream bytes = new ByteArrayOutputStream();
    RowCoder.of(schema).encode(row, bytes);
    return ExternalConfigurationPayload.newBuilder()
        .setSchema(SchemaTranslation.schemaToProto(schema, true))
        .setPayload(
            org.apache.beam.vendor.grpc.v1p69p0.com.google.protobuf.ByteString.copyFrom(
                bytes.toByteArray()))
        .build()
        .toByteArray();
  }

  public static void main(String[] argv) throws IOException {
    Options options = PipelineOptionsFactory.fromArgs(argv).withValidation().as(Options.class);
    Pipeline p = Pipeline.create(options);
    PCollection<String> words = p.apply(Create.of(Arrays.asList(options.getWords().split(","))));
    PCollection<String> mapped =
        words.apply(
            "PythonMap",
            External.<PCollection<String>, String>of(
                    URN, payload(options.getPythonFn()), options.getExpansionService())
                .withOutputCoder(StringUtf8Coder.of()));
    mapped.apply(TextIO.write().to(options.getOutput()).withoutSharding());
    org.apache.beam.sdk.PipelineResult.State state = p.run().waitUntilFinish();
    if (state != org.apache.beam.sdk.PipelineResult.State.DONE) {
      throw new IllegalStateException("the job ended " + state);
    }
  }
}
