// Hot.nativeCall: C on the JNI path that calls back into Java
// (Hot.callback), so tests/java.rs sees Java frames above and below a
// native one.
#include <jni.h>

#include "Hot.h"

JNIEXPORT void JNICALL Java_Hot_nativeCall(JNIEnv *env, jclass hot, jint round) {
    jmethodID callback = (*env)->GetStaticMethodID(env, hot, "callback", "(I)V");
    if (callback == NULL) {
        return;  // NoSuchMethodError is pending; Java throws it.
    }
    (*env)->CallStaticVoidMethod(env, hot, callback, round);
}
