// segmentio/kafka-go (Debian 12: golang-github-segmentio-kafka-go-dev 0.2.1) against
// `mqcore serve`, driven by tests/test_clients_go.py. Built at test time with GO111MODULE=off
// GOPATH=/usr/share/gocode.
//
//	kafkago write -brokers B -topic T -count N [-codec C] [-partition P]
//	kafkago read  -brokers B -topic T -count N [-partition P]
//	kafkago group -brokers B -topic T -count N -group G
//
// write sends N messages (key "k<i>", value "kafka-go <i>") to partition P with a Writer and
// prints {"written":N}; read reads partition P from its first offset and group reads as a
// member of consumer group G, committing each message; both print each message as
// {"partition":P,"offset":O,"key":K,"value":V} and stop after N. Any error, or -timeout
// seconds passing, ends the run with status 1 and the error on stderr.
package main

import (
	"context"
	"fmt"
	"time"

	kafka "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/gzip"
	"github.com/segmentio/kafka-go/lz4"
	"github.com/segmentio/kafka-go/snappy"
)

const program = "kafka-go"

// fixed sends every message to one partition, so the test can check their order.
type fixed int

func (f fixed) Balance(_ kafka.Message, _ ...int) int { return int(f) }

func write(ctx context.Context) {
	codecs := map[string]kafka.CompressionCodec{
		"none": nil, "gzip": gzip.NewCompressionCodec(),
		"snappy": snappy.NewCompressionCodec(), "lz4": lz4.NewCompressionCodec(),
	}
	cc, ok := codecs[*codec]
	if !ok {
		fail("unknown codec %q", *codec)
	}
	w := kafka.NewWriter(kafka.WriterConfig{
		Brokers: []string{*brokers}, Topic: *topic, Balancer: fixed(*partition),
		CompressionCodec: cc, MaxAttempts: 3, BatchTimeout: 10 * time.Millisecond,
	})
	msgs := make([]kafka.Message, *count)
	for i := range msgs {
		msgs[i] = kafka.Message{
			Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte(fmt.Sprintf("kafka-go %d %s", i, padding)),
		}
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		fail("write: %v", err)
	}
	if err := w.Close(); err != nil {
		fail("close: %v", err)
	}
	emit(map[string]int{"written": *count})
}

func read(ctx context.Context, cfg kafka.ReaderConfig) {
	r := kafka.NewReader(cfg)
	for n := 0; n < *count; n++ {
		m, err := r.ReadMessage(ctx) // commits at once when the reader has a group
		if err != nil {
			fail("read after %d of %d messages: %v", n, *count, err)
		}
		emit(record{Partition: int32(m.Partition), Offset: m.Offset, Key: string(m.Key), Value: string(m.Value)})
	}
	if err := r.Close(); err != nil {
		fail("close: %v", err)
	}
}

func main() {
	cmd := start("write|read|group")
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(*timeout)*time.Second)
	defer cancel()
	cfg := kafka.ReaderConfig{
		Brokers: []string{*brokers}, Topic: *topic, MaxWait: 500 * time.Millisecond,
		ReadLagInterval: -1,
	}
	switch cmd {
	case "write":
		write(ctx)
	case "read":
		cfg.Partition = *partition
		read(ctx, cfg)
	case "group":
		cfg.GroupID = *group
		read(ctx, cfg)
	default:
		fail("unknown command %q", cmd)
	}
}
