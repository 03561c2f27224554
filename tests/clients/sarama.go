// Sarama (Debian 12: golang-github-shopify-sarama-dev 1.22.1) against `mqcore serve`, driven by
// tests/test_clients_go.py. Built at test time with GO111MODULE=off GOPATH=/usr/share/gocode.
//
//	sarama produce -brokers B -topic T -count N [-version V] [-codec C] [-partition P]
//	sarama consume -brokers B -topic T -count N [-version V]
//	sarama group   -brokers B -topic T -count N -group G [-version V]
//
// produce writes N messages (key "k<i>", value "sarama <i>") with a SyncProducer, one line per
// message: {"partition":P,"offset":O}. consume reads every partition from the oldest offset
// and group joins consumer group G, marking each message; both print each message as
// {"partition":P,"offset":O,"key":K,"value":V} and stop after N (group commits on close).
// Any error, or -timeout seconds passing, ends the run with status 1 and the error on stderr.
// -version "default" keeps sarama's own default (V0_8_2_0), otherwise a Kafka version.
package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/Shopify/sarama"
)

const program = "sarama"

var version = flag.String("version", "default", "Kafka version sarama speaks, or default")

func config() *sarama.Config {
	c := sarama.NewConfig()
	c.ClientID = "mqcore-test-sarama"
	if *version != "default" {
		v, err := sarama.ParseKafkaVersion(*version)
		if err != nil {
			fail("%v", err)
		}
		c.Version = v
	}
	codecs := map[string]sarama.CompressionCodec{
		"none": sarama.CompressionNone, "gzip": sarama.CompressionGZIP,
		"snappy": sarama.CompressionSnappy, "lz4": sarama.CompressionLZ4,
		"zstd": sarama.CompressionZSTD,
	}
	cc, ok := codecs[*codec]
	if !ok {
		fail("unknown codec %q", *codec)
	}
	c.Producer.Compression = cc
	c.Producer.Return.Successes = true
	c.Producer.Partitioner = sarama.NewManualPartitioner
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Consumer.Return.Errors = true
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.Metadata.Retry.Max = 2
	return c
}

func produce() {
	p, err := sarama.NewSyncProducer([]string{*brokers}, config())
	if err != nil {
		fail("producer: %v", err)
	}
	defer p.Close()
	for i := 0; i < *count; i++ {
		part, off, err := p.SendMessage(&sarama.ProducerMessage{
			Topic: *topic, Partition: int32(*partition),
			Key:   sarama.StringEncoder(fmt.Sprintf("k%d", i)),
			Value: sarama.StringEncoder(fmt.Sprintf("sarama %d %s", i, padding)),
		})
		if err != nil {
			fail("send %d: %v", i, err)
		}
		emit(record{Partition: part, Offset: off})
	}
}

func consume() {
	c, err := sarama.NewConsumer([]string{*brokers}, config())
	if err != nil {
		fail("consumer: %v", err)
	}
	defer c.Close()
	parts, err := c.Partitions(*topic)
	if err != nil {
		fail("partitions: %v", err)
	}
	msgs := make(chan *sarama.ConsumerMessage)
	for _, p := range parts {
		pc, err := c.ConsumePartition(*topic, p, sarama.OffsetOldest)
		if err != nil {
			fail("partition %d: %v", p, err)
		}
		defer pc.Close()
		go func(pc sarama.PartitionConsumer) {
			for m := range pc.Messages() {
				msgs <- m
			}
		}(pc)
		go func(pc sarama.PartitionConsumer) {
			for e := range pc.Errors() {
				fail("fetch: %v", e)
			}
		}(pc)
	}
	deadline := time.After(time.Duration(*timeout) * time.Second)
	for n := 0; n < *count; n++ {
		select {
		case m := <-msgs:
			emit(record{Partition: m.Partition, Offset: m.Offset, Key: string(m.Key), Value: string(m.Value)})
		case <-deadline:
			fail("timed out after %d of %d messages", n, *count)
		}
	}
}

// handler hands every claimed message to seen and marks it for the next commit.
type handler struct {
	seen chan<- *sarama.ConsumerMessage
}

func (handler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (handler) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (h handler) ConsumeClaim(s sarama.ConsumerGroupSession, c sarama.ConsumerGroupClaim) error {
	for m := range c.Messages() {
		h.seen <- m
		s.MarkMessage(m, "")
	}
	return nil
}

func consumeGroup() {
	g, err := sarama.NewConsumerGroup([]string{*brokers}, *group, config())
	if err != nil {
		fail("group: %v", err)
	}
	go func() {
		for e := range g.Errors() {
			fail("group: %v", e)
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	seen := make(chan *sarama.ConsumerMessage)
	go func() {
		for ctx.Err() == nil {
			if err := g.Consume(ctx, []string{*topic}, handler{seen}); err != nil {
				fail("group.Consume: %v", err)
			}
		}
	}()
	deadline := time.After(time.Duration(*timeout) * time.Second)
	for n := 0; n < *count; n++ {
		select {
		case m := <-seen:
			emit(record{Partition: m.Partition, Offset: m.Offset, Key: string(m.Key), Value: string(m.Value)})
		case <-deadline:
			fail("timed out after %d of %d messages", n, *count)
		}
	}
	cancel()
	go func() { // the handler may be waiting to hand over one more message
		for range seen {
		}
	}()
	if err := g.Close(); err != nil { // commits what was marked
		fail("close: %v", err)
	}
}

func main() {
	cmd := start("produce|consume|group")
	switch cmd {
	case "produce":
		produce()
	case "consume":
		consume()
	case "group":
		consumeGroup()
	default:
		fail("unknown command %q", cmd)
	}
}
