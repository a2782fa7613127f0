package statestore.interop;

import java.util.List;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.EmitStrategy;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.KGroupedStream;
import org.apache.kafka.streams.kstream.KStream;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.SessionWindows;
import org.apache.kafka.streams.kstream.SlidingWindows;
import org.apache.kafka.streams.kstream.TimeWindows;
import org.apache.kafka.streams.state.SessionStore;
import org.apache.kafka.streams.state.WindowStore;

/**
 * The topology of {@code StreamsApp --stores emit-final}: the tumbling windowed count {@code wcounts}, a sliding
 * windowed count {@code swcounts} (1-minute time difference, no grace: retention 2 minutes) and the session-windowed
 * count {@code scounts}, each with {@code emitStrategy(EmitStrategy.onWindowClose())} (Kafka Streams' time-ordered
 * window and session stores, {@code RocksDbIndexedTimeOrderedWindowBytesStoreSupplier},
 * {@code RocksDbTimeOrderedSessionBytesStoreSupplier}). Run with {@code --config dsl.store.format=headers} on Kafka
 * Streams 4.3+, the DSL gives them the header-aware variants. Its APIs exist since Kafka Streams 3.3, so every
 * build has it (the {@code .checkpoint} layout's proofs with 3.9 and 4.2 included).
 */
final class EmitFinalTopology {
    static final String NAME = "emit-final";
    static final String SWCOUNTS = "swcounts";
    static final List<String> STORES = List.of(StreamsApp.WCOUNTS, SWCOUNTS, StreamsApp.SCOUNTS);

    private EmitFinalTopology() {}

    static Topology topology(String input, AtomicLong processed) {
        StreamsBuilder b = new StreamsBuilder();
        KStream<String, String> in = b.stream(input, Consumed.with(Serdes.String(), Serdes.String()))
                .peek((k, v) -> processed.incrementAndGet());
        grouped(in).windowedBy(TimeWindows.ofSizeWithNoGrace(StreamsApp.WINDOW_SIZE))
                .emitStrategy(EmitStrategy.onWindowClose())
                .count(windowed(StreamsApp.WCOUNTS));
        grouped(in).windowedBy(SlidingWindows.ofTimeDifferenceWithNoGrace(StreamsApp.WINDOW_SIZE))
                .emitStrategy(EmitStrategy.onWindowClose())
                .count(windowed(SWCOUNTS));
        grouped(in).windowedBy(SessionWindows.ofInactivityGapWithNoGrace(StreamsApp.SESSION_GAP))
                .emitStrategy(EmitStrategy.onWindowClose())
                .count(Materialized.<String, Long, SessionStore<Bytes, byte[]>>as(StreamsApp.SCOUNTS)
                        .withKeySerde(Serdes.String())
                        .withValueSerde(Serdes.Long()));
        return b.build();
    }

    private static KGroupedStream<String, String> grouped(KStream<String, String> in) {
        return in.groupByKey(Grouped.with(Serdes.String(), Serdes.String()));
    }

    private static Materialized<String, Long, WindowStore<Bytes, byte[]>> windowed(String name) {
        return Materialized.<String, Long, WindowStore<Bytes, byte[]>>as(name)
                .withKeySerde(Serdes.String())
                .withValueSerde(Serdes.Long());
    }
}
