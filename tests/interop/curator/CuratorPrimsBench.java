/*
 * CuratorPrimsBench — Curator's coordination recipes measured the way
 * cerberus-bench measures Cerberus's (bench/scenario_prims.c,
 * bench/scenario_elect.c), for the peer rows of bench/peers/curator.sh.
 *
 *   java -cp <curator jars>:<dir> CuratorPrimsBench <connect> <root> semaphore <permits> <seconds>
 *   java -cp <curator jars>:<dir> CuratorPrimsBench <connect> <root> rwlock <threads> <seconds>
 *   java -cp <curator jars>:<dir> CuratorPrimsBench <connect> <root> candidate <name> <idx> <session_ms>
 *
 * semaphore: InterProcessSemaphoreV2 with <permits> leases; 2 x permits
 *   threads, each with its own client (its own session, as separate
 *   processes would have), loop acquire() (no wait limit) + returnLease();
 *   the latency is the acquire wait. Prints cycles/s and p50/p90/p99.
 * rwlock: InterProcessReadWriteLock; <threads> threads, a client each; one
 *   cycle in ten takes the write lock, the others the read lock (the same
 *   xorshift32 draws per thread as the bench), ~10 us of busy work held;
 *   the latency is the cycle.
 * candidate: one LeaderLatch candidate for bench/peers/peerlib.py's
 *   elect-failover driver: a client with a session timeout of <session_ms>
 *   (Cerberus's zk.session_timeout_ms), "ready <idx>" once its latch node
 *   exists, "elected <idx> <System.nanoTime()>" the moment it leads
 *   (nanoTime is CLOCK_MONOTONIC on Linux, the clock the driver stamps
 *   the kill with), then it leads until stdin reaches EOF and closes the
 *   latch.
 * semaphore and rwlock run an unmeasured warm-up of a tenth of the time
 * (0.5 s at most, the JIT included) first. Output: one line "curator
 * <scenario> ..." of key=value pairs (candidate: the lines above).
 */
import java.io.InputStream;
import java.util.Arrays;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.leader.LeaderLatch;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.framework.recipes.locks.InterProcessReadWriteLock;
import org.apache.curator.framework.recipes.locks.InterProcessSemaphoreV2;
import org.apache.curator.framework.recipes.locks.Lease;
import org.apache.curator.retry.RetryNTimes;

public final class CuratorPrimsBench {
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

    static CuratorFramework client(String connect, int sessionMs) throws InterruptedException {
        CuratorFramework c = CuratorFrameworkFactory.newClient(connect, sessionMs, 5000,
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

    interface Cycle {
        /** One cycle; returns the latency to record (ns). */
        long run(int thread) throws Exception;
    }

    /** n threads looping cycle until the end of the window; the latencies
     * of the cycles that started inside it. */
    static long[] loop(int n, double seconds, Cycle cycle, int[] total) throws Exception {
        Lat[] lats = new Lat[n];
        Thread[] ts = new Thread[n];
        long warm = (long) Math.min(500e6, Math.max(50e6, seconds * 1e8));
        long measureFrom = System.nanoTime() + warm;
        long end = measureFrom + (long) (seconds * 1e9);
        CountDownLatch go = new CountDownLatch(1);
        for (int i = 0; i < n; i++) {
            final int idx = i;
            lats[i] = new Lat();
            ts[i] = new Thread(() -> {
                try {
                    go.await();
                    for (;;) {
                        long t0 = System.nanoTime();
                        long lat = cycle.run(idx);
                        long t1 = System.nanoTime();
                        if (t1 >= end)
                            break;
                        if (t0 >= measureFrom)
                            lats[idx].add(lat);
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
        return merge(lats, total);
    }

    static void print(String what, long[] all, int n, double seconds) {
        System.out.printf("curator %s ops/s=%.0f p50_us=%.1f p90_us=%.1f p99_us=%.1f max_us=%.1f%n",
                what, n / seconds, pct(all, n, 0.5), pct(all, n, 0.9), pct(all, n, 0.99),
                n > 0 ? all[n - 1] / 1000.0 : 0.0);
    }

    static void semaphore(String connect, String root, int permits, double seconds)
            throws Exception {
        int n = 2 * permits;
        String path = root + "/bench-cs-" + ProcessHandle.current().pid();
        CuratorFramework[] cs = new CuratorFramework[n];
        InterProcessSemaphoreV2[] sems = new InterProcessSemaphoreV2[n];
        for (int i = 0; i < n; i++) {
            cs[i] = client(connect, 10000);
            sems[i] = new InterProcessSemaphoreV2(cs[i], path, permits);
        }
        int[] total = new int[1];
        long[] all = loop(n, seconds, i -> {
            long t0 = System.nanoTime();
            Lease l = sems[i].acquire();
            long t1 = System.nanoTime();
            sems[i].returnLease(l);
            return t1 - t0;
        }, total);
        for (CuratorFramework c : cs)
            c.close();
        print("semaphore threads=" + n + " permits=" + permits, all, total[0], seconds);
    }

    static void rwlock(String connect, String root, int threads, double seconds)
            throws Exception {
        String path = root + "/bench-crw-" + ProcessHandle.current().pid();
        CuratorFramework[] cs = new CuratorFramework[threads];
        InterProcessReadWriteLock[] rws = new InterProcessReadWriteLock[threads];
        int[] rng = new int[threads];
        for (int i = 0; i < threads; i++) {
            cs[i] = client(connect, 10000);
            rws[i] = new InterProcessReadWriteLock(cs[i], path);
            rng[i] = 0x9e3779b9 ^ (int) ((i + 1) * 2654435761L);
            if (rng[i] == 0)
                rng[i] = 1;
        }
        int[] total = new int[1];
        long[] all = loop(threads, seconds, i -> {
            int x = rng[i];
            x ^= x << 13;
            x ^= x >>> 17;
            x ^= x << 5;
            rng[i] = x;
            boolean write = Integer.remainderUnsigned(x, 10) == 0;
            InterProcessMutex m = write ? rws[i].writeLock() : rws[i].readLock();
            long t0 = System.nanoTime();
            m.acquire();
            long t;
            do
                t = System.nanoTime();
            while (t - t0 < 10_000);
            m.release();
            return System.nanoTime() - t0;
        }, total);
        for (CuratorFramework c : cs)
            c.close();
        print("rwlock threads=" + threads, all, total[0], seconds);
    }

    static void candidate(String connect, String root, String name, String idx, int sessionMs)
            throws Exception {
        CuratorFramework c = client(connect, sessionMs);
        LeaderLatch latch = new LeaderLatch(c, root + "/" + name, "bench-candidate-" + idx);
        latch.start();
        while (latch.getOurPath() == null)
            Thread.sleep(5);
        System.out.println("ready " + idx);
        System.out.flush();
        latch.await();
        long t = System.nanoTime();
        System.out.println("elected " + idx + " " + t);
        System.out.flush();
        InputStream in = System.in;
        byte[] b = new byte[64];
        while (in.read(b) >= 0)
            ;
        latch.close();
        c.close();
    }

    public static void main(String[] args) throws Exception {
        if (args.length < 5) {
            System.err.println("usage: CuratorPrimsBench <connect> <root> semaphore|rwlock <n> <seconds>"
                    + " | candidate <name> <idx> <session_ms>");
            System.exit(64);
        }
        switch (args[2]) {
        case "semaphore":
            semaphore(args[0], args[1], Integer.parseInt(args[3]), Double.parseDouble(args[4]));
            break;
        case "rwlock":
            rwlock(args[0], args[1], Integer.parseInt(args[3]), Double.parseDouble(args[4]));
            break;
        case "candidate":
            candidate(args[0], args[1], args[3], args[4], Integer.parseInt(args[5]));
            break;
        default:
            System.err.println("unknown scenario " + args[2]);
            System.exit(64);
        }
        System.exit(0);
    }
}
