// The Java program tests/java.rs profiles: a known call graph, the same on
// JDK 11, 17 and 21 (compiled once, `javac --release 11`).
//
//   Hot$Worker.run → handler → hotLoop → mix (C2 inlines it)    3 parts
//                            → coldLoop                         1/4 part
//                            → viaLambda → (IntSupplier) lambda$viaLambda$0 → coldLoop
//                            → viaReflection → Method.invoke → reflected → coldLoop
//                            → viaJni → nativeCall → Java_Hot_nativeCall (C)
//                                       → callback → coldLoop
//
// hotLoop does 3 times the work of all the coldLoop calls together. The
// workers are threads named hot-worker-N (their comm too, which roots
// hostprof's folded stacks; JFR reports the same name). They warm up under
// the name hot-warmup-N, so a recording started at launch (JFR's) can leave
// out the warm-up; once every worker is warm, main prints "warm" and runs
// for the seconds given as argument (0: until killed), then prints the
// workers' throughput since then (all workers together), per second and per
// CPU second of theirs, `rounds/s: R; per CPU s: C`, which `cargo xtask
// bench` compares with and without profilers (per CPU second: what other
// load on the host takes from the workers cancels out).
//
// Keep the names and the shape stable: tests/java.rs looks for them.
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;
import java.lang.reflect.Method;
import java.util.Locale;
import java.util.concurrent.CountDownLatch;
import java.util.function.IntSupplier;

public class Hot {
    // Iterations of the cold part, per round; hotLoop runs 3 times as many.
    static final int COLD = 200_000;
    // Rounds before a worker counts as warm: enough for C2 to compile the
    // loops (on-stack replacement, then the methods themselves).
    static final int WARMUP_ROUNDS = 200;

    // Results go here so that the JIT cannot drop the loops.
    static volatile long sink;

    static native void nativeCall(int round);

    static final Method REFLECTED;

    static {
        try {
            REFLECTED = Hot.class.getDeclaredMethod("reflected", int.class);
        } catch (NoSuchMethodException e) {
            throw new AssertionError(e);
        }
    }

    static final class Worker extends Thread {
        private final int index;
        private final CountDownLatch warm;
        // Rounds done once warm; written by this worker only, read by main.
        volatile long rounds;

        Worker(int index, CountDownLatch warm) {
            super("hot-warmup-" + index);
            this.index = index;
            this.warm = warm;
            setDaemon(true);
        }

        @Override
        public void run() {
            for (int round = 0; round < WARMUP_ROUNDS; round++) {
                handler(round);
            }
            // Renaming the current thread renames its OS thread (comm) too.
            setName("hot-worker-" + index);
            warm.countDown();
            for (int round = 0; ; round++) {
                handler(round);
                rounds++;
            }
        }
    }

    static void handler(int round) {
        long total = hotLoop(3 * COLD, round);
        total += coldLoop(COLD / 4, round);
        total += viaLambda(round);
        total += viaReflection(round);
        total += viaJni(round);
        sink = total;
    }

    static long hotLoop(int iterations, int seed) {
        long x = seed;
        for (int i = 0; i < iterations; i++) {
            x = mix(x, i);
        }
        return x;
    }

    // Small, so C2 inlines it into hotLoop.
    static long mix(long x, int i) {
        return x * 6364136223846793005L + (i ^ (x >>> 29));
    }

    static long coldLoop(int iterations, int seed) {
        long x = seed;
        for (int i = 0; i < iterations; i++) {
            x = x * 6364136223846793005L + (i ^ (x >>> 29));
        }
        return x;
    }

    static long viaLambda(int round) {
        IntSupplier work = () -> (int) coldLoop(COLD / 4, round);
        return work.getAsInt();
    }

    static long viaReflection(int round) {
        try {
            return (Long) REFLECTED.invoke(null, round);
        } catch (ReflectiveOperationException e) {
            throw new AssertionError(e);
        }
    }

    static long reflected(int round) {
        return coldLoop(COLD / 4, round);
    }

    static long viaJni(int round) {
        nativeCall(round);
        return sink;
    }

    // Called back from C (Java_Hot_nativeCall) through JNI.
    static void callback(int round) {
        sink = coldLoop(COLD / 4, round);
    }

    public static void main(String[] args) throws Exception {
        // The JNI library's absolute path, then seconds to run once warm.
        System.load(args[0]);
        long seconds = Long.parseLong(args[1]);
        int threads = args.length > 2 ? Integer.parseInt(args[2]) : 2;
        CountDownLatch warm = new CountDownLatch(threads);
        Worker[] workers = new Worker[threads];
        for (int i = 0; i < threads; i++) {
            workers[i] = new Worker(i, warm);
            workers[i].start();
        }
        warm.await();
        // Workers warm at different times: count from here, for all of them.
        ThreadMXBean mxBean = ManagementFactory.getThreadMXBean();
        long start = System.nanoTime();
        long cpuBefore = cpuNanos(mxBean, workers);
        long before = rounds(workers);
        System.out.println("warm");
        System.out.flush();
        if (seconds > 0) {
            Thread.sleep(seconds * 1000);
            long done = rounds(workers) - before;
            double elapsed = (System.nanoTime() - start) / 1e9;
            double cpu = (cpuNanos(mxBean, workers) - cpuBefore) / 1e9;
            // Locale.ROOT: a decimal point whatever the locale.
            System.out.printf(
                    Locale.ROOT, "rounds/s: %.2f; per CPU s: %.2f%n", done / elapsed, done / cpu);
        } else {
            new CountDownLatch(1).await();
        }
    }

    static long rounds(Worker[] workers) {
        long total = 0;
        for (Worker worker : workers) {
            total += worker.rounds;
        }
        return total;
    }

    static long cpuNanos(ThreadMXBean threads, Worker[] workers) {
        long total = 0;
        for (Worker worker : workers) {
            total += threads.getThreadCpuTime(worker.getId());
        }
        return total;
    }
}
