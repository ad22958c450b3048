/*
 * CuratorBench — Curator's InterProcessMutex measured the way cerberus-bench
 * measures Cerberus (bench/scenarios.c), for the peer comparison in
 * bench/peers/curator.sh.
 *
 *   java -cp <curator jars>:<dir> CuratorBench <connect> <root> uncontended <threads> <seconds>
 *   java -cp <curator jars>:<dir> CuratorBench <connect> <root> handoff <contenders> <seconds>
 *
 * uncontended: one CuratorFramework client shared by N threads (as the
 *   Cerberus side shares one cerb_client), each looping acquire + release
 *   on a lock path of its own; a cycle's latency is from before acquire to
 *   after release. Prints cycles/s and p50/p99.
 * handoff: N contenders, each with its own client (its own session, as
 *   separate processes would have), on one path. A holder does ~20 µs of
 *   busy work, stamps the shared "last release" time just before release;
 *   the next holder takes its own time right after acquire minus that stamp
 *   as the hand-off latency. Prints acquisitions/s and p50/p90/p99.
 * Both run an unmeasured warm-up of a tenth of the time (0.5 s at most, the
 * JIT included) first. Output: one line "curator <scenario> ..." of
 * key=value pairs.
 */
import java.util.Arrays;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryNTimes;

public final class CuratorBench {
    /** Latencies of one thread, in ns. */
    static final class Lat {
        long[] v = new long[1 << 14];
        int n;

        void add(long x) {
            if (n == v.length)
                v = Arrays.copyOf(v, n * 2);
            v[n++] = x;
        }
    }

    static CuratorFramework client(String connect) throws InterruptedException {
        CuratorFramework c = CuratorFrameworkFactory.newClient(connect, 10000, 5000,
                new RetryNTimes(3, 100));
        c.start();
        if (!c.blockUntilConnected(10, TimeUnit.SECONDS))
            throw new IllegalStateException("not connected to " + connect);
        return c;
    }

    static double pct(long[] sorted, int n, double q) {
        if (n == 0)
            return 0;
        int i = (int) Math.ceil(q * n) - 1;
        return sorted[Math.max(0, Math.min(n - 1, i))] / 1000.0;
    }

    static long[] merge(Lat[] lats, int[] total) {
        int n = 0;
        for (Lat l : lats)
            n += l.n;
        long[] all = new long[n];
        int k = 0;
        for (Lat l : lats) {
            System.arraycopy(l.v, 0, all, k, l.n);
            k += l.n;
        }
        Arrays.sort(all);
        total[0] = n;
        return all;
    }

    static volatile long phaseEnd;
    static volatile boolean measuring;

    static void uncontended(String connect, String root, int threads, double seconds)
            throws Exception {
        CuratorFramework c = client(connect);
        long pid = ProcessHandle.current().pid();
        Lat[] lats = new Lat[threads];
        long[] counts = new long[threads];
        Thread[] ts = new Thread[threads];
        long warm = (long) Math.min(500e6, Math.max(50e6, seconds * 1e8));
        long start = System.nanoTime();
        long measureFrom = start + warm;
        phaseEnd = measureFrom + (long) (seconds * 1e9);
        CountDownLatch go = new CountDownLatch(1);
        for (int i = 0; i < threads; i++) {
            final int idx = i;
            lats[i] = new Lat();
            InterProcessMutex m = new InterProcessMutex(c, root + "/bench-cu-" + pid + "-" + i);
            ts[i] = new Thread(() -> {
                try {
                    go.await();
                    for (;;) {
                        long t0 = System.nanoTime();
                        m.acquire();
                        m.release();
                        long t1 = System.nanoTime();
                        if (t1 >= phaseEnd)
                            break;
                        if (t0 >= measureFrom) {
                            lats[idx].add(t1 - t0);
                            counts[idx]++;
                        }
                    }
                } catch (Exception ex) {
                    ex.printStackTrace();
                    System.exit(1);
                }
            });
            ts[i].start();
        }
        go.countDown();
        for (Thread t : ts)
            t.join();
        c.close();
        int[] n = new int[1];
        long[] all = merge(lats, n);
        System.out.printf("curator uncontended threads=%d ops/s=%.0f p50_us=%.1f p99_us=%.1f max_us=%.1f%n",
                threads, n[0] / seconds, pct(all, n[0], 0.5), pct(all, n[0], 0.99),
                n[0] > 0 ? all[n[0] - 1] / 1000.0 : 0.0);
    }

    static void handoff(String connect, String root, int contenders, double seconds)
            throws Exception {
        long pid = ProcessHandle.current().pid();
        String path = root + "/bench-ch-" + pid;
        CuratorFramework[] cs = new CuratorFramework[contenders];
        Lat[] lats = new Lat[contenders];
        Thread[] ts = new Thread[contenders];
        AtomicLong lastRelease = new AtomicLong(0);
        long warm = (long) Math.min(500e6, Math.max(50e6, seconds * 1e8));
        CountDownLatch go = new CountDownLatch(1);
        for (int i = 0; i < contenders; i++)
            cs[i] = client(connect);
        long start = System.nanoTime();
        long measureFrom = start + warm;
        phaseEnd = measureFrom + (long) (seconds * 1e9);
        for (int i = 0; i < contenders; i++) {
            final int idx = i;
            lats[i] = new Lat();
            InterProcessMutex m = new InterProcessMutex(cs[i], path);
            ts[i] = new Thread(() -> {
                try {
                    go.await();
                    for (;;) {
                        m.acquire();
                        long tAcq = System.nanoTime();
                        long prev = lastRelease.get();
                        if (prev != 0 && tAcq >= measureFrom && tAcq < phaseEnd)
                            lats[idx].add(tAcq - prev);
                        long tRel;
                        do
                            tRel = System.nanoTime();
                        while (tRel - tAcq < 20_000);
                        lastRelease.set(tRel);
                        m.release();
                        if (tRel >= phaseEnd)
                            break;
                    }
                } catch (Exception ex) {
                    ex.printStackTrace();
                    System.exit(1);
                }
            });
            ts[i].start();
        }
        go.countDown();
        for (Thread t : ts)
            t.join();
        for (CuratorFramework c : cs)
            c.close();
        int[] n = new int[1];
        long[] all = merge(lats, n);
        System.out.printf("curator handoff contenders=%d acq/s=%.0f p50_us=%.1f p90_us=%.1f p99_us=%.1f max_us=%.1f%n",
                contenders, n[0] / seconds, pct(all, n[0], 0.5), pct(all, n[0], 0.9),
                pct(all, n[0], 0.99), n[0] > 0 ? all[n[0] - 1] / 1000.0 : 0.0);
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 5) {
            System.err.println("usage: CuratorBench <connect> <root> uncontended|handoff <threads> <seconds>");
            System.exit(64);
        }
        int n = Integer.parseInt(args[3]);
        double s = Double.parseDouble(args[4]);
        if (args[2].equals("uncontended"))
            uncontended(args[0], args[1], n, s);
        else if (args[2].equals("handoff"))
            handoff(args[0], args[1], n, s);
        else {
            System.err.println("unknown scenario " + args[2]);
            System.exit(64);
        }
        System.exit(0);
    }
}
