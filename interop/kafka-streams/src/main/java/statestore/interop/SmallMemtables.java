package statestore.interop;

import java.util.Map;

import org.apache.kafka.streams.state.RocksDBConfigSetter;
import org.rocksdb.Options;

/**
 * A {@code rocksdb.config.setter} that shrinks every store's memtable to {@code statestore.write.buffer.bytes}
 * (default 64 KiB), so RocksDB flushes while the application runs, as a production store under load does; a test
 * that SIGKILLs the application then finds on disk what Kafka Streams wrote since it opened its stores (the status
 * OPEN among it), not only what an earlier clean close left.
 */
public final class SmallMemtables implements RocksDBConfigSetter {
    public static final String WRITE_BUFFER_BYTES = "statestore.write.buffer.bytes";

    @Override
    public void setConfig(String storeName, Options options, Map<String, Object> configs) {
        Object v = configs.get(WRITE_BUFFER_BYTES);
        long bytes = v == null ? 64 << 10 : Long.parseLong(v.toString());
        options.setWriteBufferSize(bytes);
    }

    @Override
    public void close(String storeName, Options options) {}
}
