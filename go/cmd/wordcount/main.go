// Command wordcount counts the words of a text file with Beam's Go SDK: the
// driver of Weir's Go end-to-end test (tests/e2e/test_go.py), which runs it on
// Go's direct runner and on Weir (--runner=universal, LOOPBACK and PROCESS)
// and compares the lines it writes.
//
//	wordcount --input=king-lear.md --output=/tmp/counts.txt [--runner=direct]
//	wordcount --input=... --output=... --runner=universal --endpoint=localhost:8099 \
//	    --environment_type=LOOPBACK
//
// Each output line is "<word>: <count>"; the order of lines is not defined.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"regexp"

	"github.com/apache/beam/sdks/v2/go/pkg/beam"
	"github.com/apache/beam/sdks/v2/go/pkg/beam/io/textio"
	"github.com/apache/beam/sdks/v2/go/pkg/beam/register"
	_ "github.com/apache/beam/sdks/v2/go/pkg/beam/runners/direct"
	_ "github.com/apache/beam/sdks/v2/go/pkg/beam/runners/universal"
	"github.com/apache/beam/sdks/v2/go/pkg/beam/transforms/stats"
	"github.com/apache/beam/sdks/v2/go/pkg/beam/x/beamx"
)

var (
	input  = flag.String("input", "", "Text file (or glob) to read (required).")
	output = flag.String("output", "", "File to write the counts to (required).")
)

// A word is a run of ASCII letters, optionally followed by an apostrophe and
// one lower-case letter ("king's").
var word = regexp.MustCompile(`[A-Za-z]+('[a-z])?`)

var lines = beam.NewCounter("wordcount", "lines")

func splitWords(ctx context.Context, line string, emit func(string)) {
	lines.Inc(ctx, 1)
	for _, w := range word.FindAllString(line, -1) {
		emit(w)
	}
}

func format(w string, n int) string {
	return fmt.Sprintf("%s: %d", w, n)
}

func init() {
	register.Function3x0(splitWords)
	register.Function2x1(format)
	register.Emitter1[string]()
}

func main() {
	flag.Parse()
	beam.Init()
	if *input == "" || *output == "" {
		log.Fatal("wordcount: --input and --output are required")
	}
	p, s := beam.NewPipelineWithRoot()
	text := textio.Read(s, *input)
	words := beam.ParDo(s, splitWords, text)
	counts := stats.Count(s, words)
	textio.Write(s, *output, beam.ParDo(s, format, counts))
	if err := beamx.Run(context.Background(), p); err != nil {
		log.Fatalf("wordcount: pipeline failed: %v", err)
	}
}
