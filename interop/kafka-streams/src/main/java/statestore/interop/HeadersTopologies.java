package statestore.interop;

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.TreeMap;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.Headers;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.SessionWindows;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.kstream.Windowed;
import org.apache.kafka.streams.kstream.internals.SessionWindow;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.AggregationWithHeaders;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.KeyValueStore;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyKeyValueStore;
import org.apache.kafka.streams.state.ReadOnlySessionStore;
import org.apache.kafka.streams.state.ReadOnlyWindowStore;
import org.apache.kafka.streams.state.SessionStore;
import org.apache.kafka.streams.state.SessionStoreWithHeaders;
import org.apache.kafka.streams.state.Stores;
import org.apache.kafka.streams.state.TimestampedKeyValueStoreWithHeaders;
import org.apache.kafka.streams.state.TimestampedWindowStoreWithHeaders;
import org.apache.kafka.streams.state.ValueTimestampHeaders;
import org.apache.kafka.streams.state.WindowStore;

/**
 * The topology of {@link StreamsApp} for header-aware stores (Kafka Streams 4.3+).
 *
 * <p>{@code --stores headers}: a {@code groupByKey().count()} ({@code counts}), a tumbling windowed count
 * ({@code wcounts}) and a session-windowed count ({@code scounts}), with the windows, gap and retentions of
 * {@code --stores windowed}. Run with {@code --config dsl.store.format=headers}, the DSL gives them Kafka Streams'
 * header-aware stores ({@code keyValueWithTimestampAndHeaders}, segments of it, and session segments of
 * {@code sessionKeyValueWithHeaders}). Kafka Streams 4.4's DSL aggregations store no headers (their values hold an
 * empty H), so a Processor API node also keeps the latest value of each key with its record's headers in a store
 * of each kind, built with {@code Stores}' header-aware builders whatever the config: {@code hlatest}
 * ({@code timestampedKeyValueStoreWithHeadersBuilder}), {@code hwlatest} (a window store per minute, retention
 * 60 s) and {@code hslatest} (a session store, one session per 30 s bucket, retention 30 s). The producer attaches
 * headers to the input records ({@link HeadersChoices#addHeaders}), so those stored headers are not empty.
 *
 * <p>It uses Kafka Streams 4.3+ APIs: a build against an older Kafka Streams leaves this file out, and
 * {@link StreamsApp} reaches it only through {@link HeadersChoices}.
 */
final class HeadersTopologies {
    static final String HEADERS = HeadersChoices.HEADERS;
    static final String HLATEST = HeadersChoices.HLATEST;
    static final String HWLATEST = HeadersChoices.HWLATEST;
    static final String HSLATEST = HeadersChoices.HSLATEST;
    static final Duration SESSION_BUCKET = Duration.ofSeconds(30);

    private HeadersTopologies() {}

    static Topology topology(String input, AtomicLong processed) {
        StreamsBuilder b = new StreamsBuilder();
        KStream<String, String> in = b.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
                .peek((k, v) -> processed.incrementAndGet());
        in.groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
                .count(Materialized.<String, Long, KeyValueStore<Bytes, byte[]>>as(StreamsApp.COUNTS)
                        .withKeySerde(Serdes.String())
                        .withValueSerde(Serdes.Long()));
        in.groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
                .windowedBy(TimeWindows.ofSizeWithNoGrace(StreamsApp.WINDOW_SIZE))
                .count(windowed(StreamsApp.WCOUNTS));
        in.groupByKey(Grouped.with(Serdes.String(), Serdes.String()))
                .windowedBy(SessionWindows.ofInactivityGapWithNoGrace(StreamsApp.SESSION_GAP))
                .count(Materialized.<String, Long, SessionStore<Bytes, byte[]>>as(StreamsApp.SCOUNTS)
                        .withKeySerde(Serdes.String())
                        .withValueSerde(Serdes.Long()));
        b.addStateStore(Stores.timestampedKeyValueStoreWithHeadersBuilder(
                Stores.persistentTimestampedKeyValueStoreWithHeaders(HLATEST), Serdes.String(), Serdes.String()));
        b.addStateStore(Stores.timestampedWindowStoreWithHeadersBuilder(
                Stores.persistentTimestampedWindowStoreWithHeaders(
                        HWLATEST, StreamsApp.WINDOW_SIZE, StreamsApp.WINDOW_SIZE, false),
                Serdes.String(), Serdes.String()));
        b.addStateStore(Stores.sessionStoreWithHeadersBuilder(
                Stores.persistentSessionStoreWithHeaders(HSLATEST, SESSION_BUCKET), Serdes.String(), Serdes.String()));
        in.process(LatestWithHeaders::new, HLATEST, HWLATEST, HSLATEST);
        return b.build();
    }

    /** Keeps the latest value of each key with its record's timestamp and headers in the three stores. */
    static final class LatestWithHeaders implements Processor<String, String, Void, Void> {
        private TimestampedKeyValueStoreWithHeaders<String, String> latest;
        private TimestampedWindowStoreWithHeaders<String, String> windows;
        private SessionStoreWithHeaders<String, String> sessions;

        @Override
        public void init(ProcessorContext<Void, Void> context) {
            latest = context.getStateStore(HLATEST);
            windows = context.getStateStore(HWLATEST);
            sessions = context.getStateStore(HSLATEST);
        }

        @Override
        public void process(Record<String, String> r) {
            long ts = r.timestamp();
            latest.put(r.key(), ValueTimestampHeaders.make(r.value(), ts, r.headers()));
            windows.put(r.key(), ValueTimestampHeaders.make(r.value(), ts, r.headers()),
                    ts - ts % StreamsApp.WINDOW_SIZE.toMillis());
            long bucket = SESSION_BUCKET.toMillis();
            long start = ts - ts % bucket;
            sessions.put(new Windowed<>(r.key(), new SessionWindow(start, start + bucket - 1)),
                    AggregationWithHeaders.make(r.value(), r.headers()));
        }
    }

    /**
     * The {@code STORE} line of one of the header-aware Processor API stores, read through interactive queries;
     * an entry is {@code key[@window]} and {@code value|timestamp|headers} ({@code hslatest}: {@code value|headers}),
     * the headers {@code k=v} joined by {@code ,} ({@code k=null} for a null value).
     */
    static String summarize(KafkaStreams streams, String name, int keys, boolean print) throws Exception {
        TreeMap<String, String> all = new TreeMap<>();
        switch (name) {
            case HLATEST -> {
                ReadOnlyKeyValueStore<String, ValueTimestampHeaders<String>> s = streams.store(
                        StoreQueryParameters.fromNameAndType(
                                name, QueryableStoreTypes.<String, String>timestampedKeyValueStoreWithHeaders()));
                try (KeyValueIterator<String, ValueTimestampHeaders<String>> it = s.all()) {
                    while (it.hasNext()) {
                        KeyValue<String, ValueTimestampHeaders<String>> kv = it.next();
                        all.put(kv.key, kv.value.value() + "|" + kv.value.timestamp() + "|" + text(kv.value.headers()));
                    }
                }
            }
            case HWLATEST -> {
                ReadOnlyWindowStore<String, ValueTimestampHeaders<String>> s = streams.store(
                        StoreQueryParameters.fromNameAndType(
                                name, QueryableStoreTypes.<String, String>timestampedWindowStoreWithHeaders()));
                try (KeyValueIterator<Windowed<String>, ValueTimestampHeaders<String>> it = s.all()) {
                    while (it.hasNext()) {
                        KeyValue<Windowed<String>, ValueTimestampHeaders<String>> kv = it.next();
                        all.put(kv.key.key() + "@" + kv.key.window().start(),
                                kv.value.value() + "|" + kv.value.timestamp() + "|" + text(kv.value.headers()));
                    }
                }
            }
            default -> {
                ReadOnlySessionStore<String, AggregationWithHeaders<String>> s = streams.store(
                        StoreQueryParameters.fromNameAndType(
                                name, QueryableStoreTypes.<String, String>sessionStoreWithHeaders()));
                for (int k = 0; k < keys; k++) {
                    try (KeyValueIterator<Windowed<String>, AggregationWithHeaders<String>> it =
                            s.fetch(String.format("k%06d", k))) {
                        while (it.hasNext()) {
                            KeyValue<Windowed<String>, AggregationWithHeaders<String>> kv = it.next();
                            all.put(kv.key.key() + "@" + kv.key.window().start() + "-" + kv.key.window().end(),
                                    kv.value.aggregation() + "|" + text(kv.value.headers()));
                        }
                    }
                }
            }
        }
        return StreamsApp.digest(name, all, print);
    }

    static String text(Headers headers) {
        StringBuilder sb = new StringBuilder();
        for (Header h : headers) {
            if (sb.length() > 0) {
                sb.append(',');
            }
            sb.append(h.key()).append('=')
                    .append(h.value() == null ? "null" : new String(h.value(), StandardCharsets.UTF_8));
        }
        return sb.toString();
    }

    private static Materialized<String, Long, WindowStore<Bytes, byte[]>> windowed(String name) {
        return Materialized.<String, Long, WindowStore<Bytes, byte[]>>as(name)
                .withKeySerde(Serdes.String())
                .withValueSerde(Serdes.Long());
    }
}
