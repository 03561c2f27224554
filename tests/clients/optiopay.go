// optiopay/kafka (Debian 12: golang-github-optiopay-kafka-dev 2.1.1) against `mqcore serve`,
// driven by tests/test_clients_go.py. Built at test time with GO111MODULE=off
// GOPATH=/usr/share/gocode.
//
//	optiopay produce -brokers B -topic T -count N [-codec C] [-partition P]
//	optiopay consume -brokers B -topic T -count N [-partition P]
//
// produce writes N messages (key "k<i>", value "optiopay <i> <padding>") to partition P in
// one Produce call and prints {"partition":P,"offset":O} per message; consume reads
// partition P from its oldest offset and prints each message as
// {"partition":P,"offset":O,"key":K,"value":V}. No group: the library has no membership, and
// its offset coordinator sends FindCoordinator v1 without its key_type field, which Kafka
// cannot parse either. Any error, or -timeout seconds passing, ends the run with status 1 and
// the error on stderr.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/optiopay/kafka/v2"
	"github.com/optiopay/kafka/v2/proto"
)

const program = "optiopay"

var debug = flag.Bool("debug", false, "log the library's debug messages on stderr")

// stderrLogger shows the library's warnings and errors (and with -debug everything) on stderr,
// where the test prints them when the run fails.
type stderrLogger struct{ debug bool }

func (l stderrLogger) log(level, msg string, args []interface{}) {
	fmt.Fprintln(os.Stderr, append([]interface{}{"optiopay:", level, msg}, args...)...)
}
func (l stderrLogger) Debug(msg string, args ...interface{}) {
	if l.debug {
		l.log("DEBUG", msg, args)
	}
}
func (l stderrLogger) Info(msg string, args ...interface{}) {
	if l.debug {
		l.log("INFO", msg, args)
	}
}
func (l stderrLogger) Warn(msg string, args ...interface{})  { l.log("WARN", msg, args) }
func (l stderrLogger) Error(msg string, args ...interface{}) { l.log("ERROR", msg, args) }

func produce(b *kafka.Broker) {
	codecs := map[string]proto.Compression{"none": proto.CompressionNone,
		"gzip": proto.CompressionGzip, "snappy": proto.CompressionSnappy}
	cc, ok := codecs[*codec]
	if !ok {
		fail("unknown codec %q", *codec)
	}
	conf := kafka.NewProducerConf()
	conf.Compression = cc
	msgs := make([]*proto.Message, *count)
	for i := range msgs {
		msgs[i] = &proto.Message{Key: []byte(fmt.Sprintf("k%d", i)),
			Value: []byte(fmt.Sprintf("optiopay %d %s", i, padding))}
	}
	if _, err := b.Producer(conf).Produce(*topic, int32(*partition), msgs...); err != nil {
		fail("produce: %v", err)
	}
	for _, m := range msgs {
		emit(record{Partition: int32(*partition), Offset: m.Offset})
	}
}

func consume(b *kafka.Broker) {
	conf := kafka.NewConsumerConf(*topic, int32(*partition))
	conf.StartOffset = kafka.StartOffsetOldest
	c, err := b.Consumer(conf)
	if err != nil {
		fail("consumer: %v", err)
	}
	for n := 0; n < *count; n++ {
		m, err := c.Consume()
		if err != nil {
			fail("consume after %d of %d messages: %v", n, *count, err)
		}
		emit(record{Partition: m.Partition, Offset: m.Offset, Key: string(m.Key), Value: string(m.Value)})
	}
}

func main() {
	cmd := start("produce|consume")
	conf := kafka.NewBrokerConf("mqcore-test-optiopay")
	conf.Logger = stderrLogger{*debug}
	b, err := kafka.Dial([]string{*brokers}, conf)
	if err != nil {
		fail("dial: %v", err)
	}
	defer b.Close()
	switch cmd {
	case "produce":
		produce(b)
	case "consume":
		consume(b)
	default:
		fail("unknown command %q", cmd)
	}
}
