// What the Go client programs of tests/clients share: each is built from its own file and
// this one (tests/test_clients_go.py), so the flags every program takes, the padding of its
// messages, how it prints what it saw and how it fails are written once. Each program names
// itself in `program`.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
)

// padding makes every message compress well, as the codec checks need: librdkafka, for one,
// sends a batch uncompressed when compressing it gained nothing (harness.py: PADDING).
var padding = strings.Repeat(".", 200)

// record is one message as a program saw it or was told it was stored (harness.py: seen).
type record struct {
	Partition int32             `json:"partition"`
	Offset    int64             `json:"offset"`
	Key       string            `json:"key,omitempty"`
	Value     string            `json:"value,omitempty"`
	Headers   map[string]string `json:"headers,omitempty"`
}

var (
	brokers   = flag.String("brokers", "", "bootstrap host:port")
	topic     = flag.String("topic", "", "topic")
	count     = flag.Int("count", 0, "messages to produce or consume")
	codec     = flag.String("codec", "none", "compression codec (what the library offers)")
	partition = flag.Int("partition", 0, "the partition to produce to or read")
	group     = flag.String("group", "", "consumer group")
	timeout   = flag.Int("timeout", 60, "seconds before giving up")
	out       = json.NewEncoder(os.Stdout)
	outLock   sync.Mutex // a consumer group's sessions print from several goroutines
)

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, program+": "+format+"\n", args...)
	os.Exit(1)
}

func emit(v interface{}) {
	outLock.Lock()
	defer outLock.Unlock()
	if err := out.Encode(v); err != nil {
		fail("stdout: %v", err)
	}
}

// start reads the command and its flags and arms the watchdog: a run still going 5 s after
// -timeout ends with status 1, whatever the library is waiting for.
func start(commands string) string {
	if len(os.Args) < 2 {
		fail("usage: %s %s -brokers B -topic T -count N ...", program, commands)
	}
	cmd := os.Args[1]
	if err := flag.CommandLine.Parse(os.Args[2:]); err != nil {
		fail("%v", err)
	}
	go func() {
		time.Sleep(time.Duration(*timeout+5) * time.Second)
		fail("still running after %d s", *timeout+5)
	}()
	return cmd
}
