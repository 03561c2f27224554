// confluent-kafka-go (Debian 12: golang-github-confluentinc-confluent-kafka-go-dev 0.11.6, over
// Debian's librdkafka) against `mqcore serve`, driven by tests/test_clients_go.py. Built at test
// time with GO111MODULE=off GOPATH=/usr/share/gocode (cgo: pkg-config rdkafka).
//
//	confluent produce -brokers B -topic T -count N [-codec C] [-partition P]
//	confluent consume -brokers B -topic T -count N [-partition P]
//	confluent group   -brokers B -topic T -count N -group G
//
// produce sends N messages (key "k<i>", value "confluent <i>", header "i"=<i>) to partition P
// and prints each delivery as {"partition":P,"offset":O}; consume reads partition P from
// offset 0 by assign(); group subscribes as a member of consumer group G and commits each
// message synchronously; both print each message as
// {"partition":P,"offset":O,"key":K,"value":V,"headers":{...}} and stop after N. Any error, or
// -timeout seconds passing, ends the run with status 1 and the error on stderr.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/confluentinc/confluent-kafka-go/kafka"
)

// padding makes every message compress well, as the codec checks need: librdkafka, for one,
// sends a batch uncompressed when compressing it gained nothing (harness.py: PADDING).
var padding = strings.Repeat(".", 200)

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
	codec     = flag.String("codec", "none", "compression.codec")
	partition = flag.Int("partition", 0, "the partition to produce to or read")
	group     = flag.String("group", "", "consumer group")
	timeout   = flag.Int("timeout", 60, "seconds before giving up")
	out       = json.NewEncoder(os.Stdout)
)

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "confluent-kafka-go: "+format+"\n", args...)
	os.Exit(1)
}

func emit(r record) {
	if err := out.Encode(r); err != nil {
		fail("stdout: %v", err)
	}
}

func produce() {
	p, err := kafka.NewProducer(&kafka.ConfigMap{
		"bootstrap.servers": *brokers, "compression.codec": *codec, "linger.ms": 50,
		"message.timeout.ms": *timeout * 1000,
	})
	if err != nil {
		fail("producer: %v", err)
	}
	defer p.Close()
	reports := make(chan kafka.Event, *count)
	for i := 0; i < *count; i++ {
		err := p.Produce(&kafka.Message{
			TopicPartition: kafka.TopicPartition{Topic: topic, Partition: int32(*partition)},
			Key:            []byte(fmt.Sprintf("k%d", i)),
			Value:          []byte(fmt.Sprintf("confluent %d %s", i, padding)),
			Headers:        []kafka.Header{{Key: "i", Value: []byte(fmt.Sprintf("%d", i))}},
		}, reports)
		if err != nil {
			fail("produce %d: %v", i, err)
		}
	}
	for i := 0; i < *count; i++ {
		m := (<-reports).(*kafka.Message)
		if m.TopicPartition.Error != nil {
			fail("delivery: %v", m.TopicPartition.Error)
		}
		emit(record{Partition: m.TopicPartition.Partition, Offset: int64(m.TopicPartition.Offset)})
	}
}

func consumer(groupID string) *kafka.Consumer {
	c, err := kafka.NewConsumer(&kafka.ConfigMap{
		"bootstrap.servers": *brokers, "group.id": groupID, "enable.auto.commit": false,
		"auto.offset.reset": "earliest", "session.timeout.ms": 10000,
	})
	if err != nil {
		fail("consumer: %v", err)
	}
	return c
}

// take reads N messages from c, committing each when commit is set.
func take(c *kafka.Consumer, commit bool) {
	deadline := time.Now().Add(time.Duration(*timeout) * time.Second)
	for n := 0; n < *count; {
		if time.Now().After(deadline) {
			fail("timed out after %d of %d messages", n, *count)
		}
		m, err := c.ReadMessage(500 * time.Millisecond)
		if err != nil {
			if e, ok := err.(kafka.Error); ok && e.Code() == kafka.ErrTimedOut {
				continue
			}
			fail("read: %v", err)
		}
		headers := map[string]string{}
		for _, h := range m.Headers {
			headers[h.Key] = string(h.Value)
		}
		emit(record{m.TopicPartition.Partition, int64(m.TopicPartition.Offset), string(m.Key),
			string(m.Value), headers})
		if commit {
			if _, err := c.CommitMessage(m); err != nil {
				fail("commit: %v", err)
			}
		}
		n++
	}
}

func main() {
	if len(os.Args) < 2 {
		fail("usage: confluent produce|consume|group -brokers B -topic T -count N ...")
	}
	cmd := os.Args[1]
	if err := flag.CommandLine.Parse(os.Args[2:]); err != nil {
		fail("%v", err)
	}
	go func() {
		time.Sleep(time.Duration(*timeout+5) * time.Second)
		fail("still running after %d s", *timeout+5)
	}()
	switch cmd {
	case "produce":
		produce()
	case "consume":
		c := consumer("mqcore-test-assign")
		if err := c.Assign([]kafka.TopicPartition{{Topic: topic, Partition: int32(*partition),
			Offset: 0}}); err != nil {
			fail("assign: %v", err)
		}
		take(c, false)
		c.Close()
	case "group":
		c := consumer(*group)
		if err := c.Subscribe(*topic, nil); err != nil {
			fail("subscribe: %v", err)
		}
		take(c, true)
		if err := c.Close(); err != nil {
			fail("close: %v", err)
		}
	default:
		fail("unknown command %q", cmd)
	}
}
