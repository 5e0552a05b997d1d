// JSpin.nativeCall: C on the JNI path that calls back into Java
// (JSpin.callback), so the guest's Java check sees Java frames above and
// below a native one.
#include <jni.h>

JNIEXPORT void JNICALL Java_JSpin_nativeCall(JNIEnv *env, jclass spin, jint round) {
    jmethodID callback = (*env)->GetStaticMethodID(env, spin, "callback", "(I)V");
    if (callback == NULL) {
        return;  // NoSuchMethodError is pending; Java throws it.
    }
    (*env)->CallStaticVoidMethod(env, spin, callback, round);
}
