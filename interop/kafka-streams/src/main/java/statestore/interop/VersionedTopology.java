package statestore.interop;

import java.time.Duration;
import java.time.Instant;
import java.util.List;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.serialization.StringSerializer;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.query.QueryResult;
import org.apache.kafka.streams.query.StateQueryRequest;
import org.apache.kafka.streams.query.StateQueryResult;
import org.apache.kafka.streams.query.VersionedKeyQuery;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.state.VersionedKeyValueStore;
import org.apache.kafka.streams.state.VersionedRecord;

/**
 * The versioned topology of {@code StreamsApp --stores versioned}: a Processor API versioned key-value store
 * ({@code vtable}, {@code Stores.persistentVersionedKeyValueStore} with a history retention of 30 s, so the
 * default segment interval of 10 s) that puts every input record with its timestamp, a null value deleting; and the
 * same input as a DSL versioned table ({@code vdsl}: {@code toTable} materialized in such a store).
 *
 * <p>Its input ({@link #produce}) is made to exercise every path of the store's put logic: record {@code seq}
 * (key {@code seq % keys}) has the timestamp {@code first + seq * step}, except that every 5th record is 20 steps
 * late (out of order, within the history retention), every 23rd is 200 steps late (older than the history
 * retention: dropped), and every 7th is a tombstone.
 *
 * <p>{@link #summarize} asks the store, through interactive queries v2 ({@link VersionedKeyQuery}), for each key's
 * latest version and its version as of several times (up to 40 s before the last input timestamp), and digests
 * the answers ({@code value@validFrom-validTo}, or {@code none}).
 */
final class VersionedTopology {
    static final String STORE = "vtable";
    static final String DSL_STORE = "vdsl";
    static final List<String> STORES = List.of(STORE, DSL_STORE);
    static final Duration HISTORY_RETENTION = Duration.ofSeconds(30);
    /** Query times: the last input timestamp minus these (ms). */
    static final List<Long> AS_OF_BACK = List.of(0L, 1_000L, 5_000L, 10_000L, 20_000L, 29_000L, 40_000L);

    private VersionedTopology() {}

    /** Puts every record into the versioned store with its timestamp and counts what this run processed. */
    static final class VersionedProcessor implements Processor<String, String, Void, Void> {
        private final AtomicLong processed;
        private VersionedKeyValueStore<String, String> store;

        VersionedProcessor(AtomicLong processed) {
            this.processed = processed;
        }

        @Override
        public void init(ProcessorContext<Void, Void> context) {
            store = context.getStateStore(STORE);
        }

        @Override
        public void process(Record<String, String> record) {
            store.put(record.key(), record.value(), record.timestamp());
            processed.incrementAndGet();
        }
    }

    static Topology topology(String input, AtomicLong processed) {
        StreamsBuilder b = new StreamsBuilder();
        b.addStateStore(Stores.versionedKeyValueStoreBuilder(
                Stores.persistentVersionedKeyValueStore(STORE, HISTORY_RETENTION), Serdes.String(), Serdes.String()));
        KStream<String, String> in = b.stream(input, Consumed.with(Serdes.String(), Serdes.String()));
        in.process(() -> new VersionedProcessor(processed), STORE);
        in.toTable(Materialized.<String, String>as(Stores.persistentVersionedKeyValueStore(DSL_STORE, HISTORY_RETENTION))
                .withKeySerde(Serdes.String())
                .withValueSerde(Serdes.String()));
        return b.build();
    }

    /** The timestamp of input record {@code seq}. */
    static long timestamp(long first, long step, long seq) {
        long ts = first + seq * step;
        if (seq % 23 == 0) {
            return ts - 200 * step;
        }
        return seq % 5 == 0 ? ts - 20 * step : ts;
    }

    static void produce(StreamsApp.Args a, long firstSeq) {
        Properties p = new Properties();
        p.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, a.bootstrap);
        p.put(ProducerConfig.LINGER_MS_CONFIG, "20");
        p.put(ProducerConfig.ACKS_CONFIG, "all");
        try (KafkaProducer<String, String> prod =
                new KafkaProducer<>(p, new StringSerializer(), new StringSerializer())) {
            for (long i = 0; i < a.produce; i++) {
                long seq = firstSeq + i;
                String key = String.format("k%06d", seq % a.keys);
                String value = seq % 7 == 3 ? null : "v" + seq;
                long ts = timestamp(a.firstTimestamp, a.timeStepMs, seq);
                prod.send(new ProducerRecord<>(a.inputTopic(), null, ts, key, value));
            }
            prod.flush();
        }
        StreamsApp.out("PRODUCED records=" + a.produce);
    }

    /** One answer of store {@code name}: the version's value and validity, or none. */
    static String answer(KafkaStreams streams, String name, VersionedKeyQuery<String, String> query) {
        StateQueryResult<VersionedRecord<String>> result =
                streams.query(StateQueryRequest.inStore(name).withQuery(query));
        String found = "none";
        for (QueryResult<VersionedRecord<String>> r : result.getPartitionResults().values()) {
            if (!r.isSuccess()) {
                throw new IllegalStateException("query failed: " + r.getFailureReason() + " " + r.getFailureMessage());
            }
            VersionedRecord<String> v = r.getResult();
            if (v != null) {
                found = v.value() + "@" + v.timestamp() + "-" + v.validTo().map(String::valueOf).orElse("");
            }
        }
        return found;
    }

    /** Every key's latest version in store {@code name} and its versions as of {@link #AS_OF_BACK} before
     * {@code lastTimestamp}. */
    static String summarize(KafkaStreams streams, String name, int keys, long lastTimestamp, boolean print)
            throws Exception {
        TreeMap<String, String> all = new TreeMap<>();
        for (int k = 0; k < keys; k++) {
            String key = String.format("k%06d", k);
            all.put(key + "@latest", answer(streams, name, VersionedKeyQuery.withKey(key)));
            for (long back : AS_OF_BACK) {
                long at = lastTimestamp - back;
                all.put(key + "@" + at,
                        answer(streams, name,
                                VersionedKeyQuery.<String, String>withKey(key).asOf(Instant.ofEpochMilli(at))));
            }
        }
        return StreamsApp.digest(name, all, print);
    }
}
