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
	"fmt"
	"time"

	"github.com/confluentinc/confluent-kafka-go/kafka"
)

const program = "confluent-kafka-go"

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
		emit(record{Partition: m.TopicPartition.Partition, Offset: int64(m.TopicPartition.Offset),
			Key: string(m.Key), Value: string(m.Value), Headers: headers})
		if commit {
			if _, err := c.CommitMessage(m); err != nil {
				fail("commit: %v", err)
			}
		}
		n++
	}
}

func main() {
	cmd := start("produce|consume|group")
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
