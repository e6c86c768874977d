package io.existencegate.client;

import static org.junit.Assert.assertEquals;
import static org.junit.Assert.assertTrue;

import java.nio.file.Files;
import java.nio.file.Path;
import java.util.HexFormat;
import java.util.List;
import org.junit.Test;

/**
 * A mirror's hash is the gate's: every line of {@code clients/testdata/filter-hash.txt} (the gate's values,
 * kept equal to its hash by {@code crates/core/src/hashing.rs}) — keys of every length foldhash treats apart
 * (short, up to 128 bytes, up to 256, longer), four seeds. No gate needed.
 */
public class FilterHashTest {
  private static final Path VECTORS =
      Path.of(System.getProperty("basedir", "."), "..", "testdata", "filter-hash.txt");

  @Test
  public void everyVectorOfTheGateIsReproduced() throws Exception {
    List<String> lines = Files.readAllLines(VECTORS).stream().filter(l -> !l.startsWith("#")).toList();
    assertTrue("too few vectors in " + VECTORS + ": " + lines.size(), lines.size() >= 200);
    for (String line : lines) {
      String[] fields = line.split(" ");
      long seed = Long.parseUnsignedLong(fields[0], 16);
      byte[] key = fields[1].equals("-") ? new byte[0] : HexFormat.of().parseHex(fields[1]);
      long expected = Long.parseUnsignedLong(fields[2]);
      assertEquals("seed " + fields[0] + ", a key of " + key.length + " bytes",
          Long.toUnsignedString(expected), Long.toUnsignedString(new FilterHash(seed).hash(key)));
    }
  }
}
